# A root file hard-linked to a name outside the root and rewritten through that name, then
# put back as it was: the final tree matches the replay, so only the link itself tells
# that weights.bin held an "X" for a while (a crash then leaves it so).
import os

root = "ckpts"
os.makedirs(root)
with open(os.path.join(root, "weights.bin"), "wb") as f:
    f.write(b"w" * 100)
    os.fsync(f.fileno())
os.link(os.path.join(root, "weights.bin"), "alias.bin")
with open("alias.bin", "r+b") as f:
    f.write(b"X")
with open("alias.bin", "r+b") as f:
    f.write(b"w")
os.unlink("alias.bin")
