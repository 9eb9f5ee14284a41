# syncfs of /proc makes nothing under the root durable
import ctypes
import os

root = "ckpts"
os.makedirs(root)
with open(os.path.join(root, "weights.bin"), "wb") as f:
    f.write(b"w" * 8192)
fd = os.open("/proc/self/stat", os.O_RDONLY)
assert ctypes.CDLL(None, use_errno=True).syncfs(fd) == 0
open(os.path.join(root, "DONE"), "w").close()
d = os.open(root, os.O_RDONLY)
os.fsync(d)
