# stores after the only msync are not flushed by it; the trace cannot see them
import mmap
import os

root = "ckpts"
os.makedirs(root)
fd = os.open(os.path.join(root, "m.bin"), os.O_RDWR | os.O_CREAT, 0o644)
os.ftruncate(fd, 4096)
m = mmap.mmap(fd, 4096)
m[:1] = b"a"
m.flush()
m[:1] = b"b"
m.close()
