# an O_DSYNC write makes only its range durable, not another descriptor's writes
import os

root = "ckpts"
os.makedirs(root)
p = os.path.join(root, "weights.bin")
a = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)
os.write(a, b"w" * 8192)
b = os.open(p, os.O_WRONLY | os.O_DSYNC)
os.pwrite(b, b"W", 0)
d = os.open(root, os.O_RDONLY)
os.fsync(d)
