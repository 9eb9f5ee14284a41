# the checkpoint directory itself renamed away and made again: a window with no directory at all
import os

root = "ckpts"
os.makedirs(root)
with open(os.path.join(root, "weights.bin"), "wb") as f:
    f.write(b"w" * 100)
os.rename(root, "ckpts.old")
os.makedirs(root)
with open(os.path.join(root, "weights.bin"), "wb") as f:
    f.write(b"w" * 100)
