# The bulk of the file's data, outside the audited directory: copied in with
# copy_file_range (32 MiB made dirty without a write() for the trace to dump).
with open("bulk.src", "wb") as f:
    f.write(b"w" * (32 << 20))
