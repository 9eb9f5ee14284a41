# open(O_RDONLY | O_TRUNC) truncates on Linux
import os

root = "ckpts"
os.makedirs(root)
with open(os.path.join(root, "weights.bin"), "wb") as f:
    f.write(b"w" * 100)
    os.fsync(f.fileno())
os.close(os.open(os.path.join(root, "weights.bin"), os.O_RDONLY | os.O_TRUNC))
