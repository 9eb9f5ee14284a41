# Rewrites step-1.bin in place: through the hard link, latest.bin changes with it. Audited
# on a copy that split the two names, latest.bin would stay whole in every state (a false
# clean); the audit must preserve the link or refuse.
with open("ckpts/step-1.bin", "r+b") as f:
    f.write(b"2" * 4096)
