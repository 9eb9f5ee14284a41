# a root file hard-linked to a name outside the root and rewritten through that name
import os

root = "ckpts"
os.makedirs(root)
with open(os.path.join(root, "weights.bin"), "wb") as f:
    f.write(b"w" * 100)
    os.fsync(f.fileno())
os.link(os.path.join(root, "weights.bin"), "alias.bin")
with open("alias.bin", "r+b") as f:
    f.write(b"X")
