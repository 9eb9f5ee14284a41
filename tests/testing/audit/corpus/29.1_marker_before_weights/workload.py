# the DONE marker reached the disk, the weights did not (independent per-file fates)
import os

root = "ckpts"
os.makedirs(root)
with open(os.path.join(root, "weights.bin"), "wb") as f:
    f.write(b"w" * 8192)
with open(os.path.join(root, "DONE"), "w") as f:
    f.write("ok")
fd = os.open(root, os.O_RDONLY)
os.fsync(fd)
os.close(fd)
