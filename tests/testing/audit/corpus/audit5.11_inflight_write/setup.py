# The directory the user already has: a complete save (w, DONE); and the new bytes,
# outside it (copied in with copy_file_range: 32 MiB without a write() to dump).
import os

with open("bulk.src", "wb") as f:
    f.write(b"n" * (32 << 20))
os.makedirs("ckpts")
with open("ckpts/w", "wb") as f:
    f.write(b"o" * (32 << 20))
open("ckpts/DONE", "w").close()
