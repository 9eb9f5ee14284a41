# pwritev2(RWF_APPEND) appends whatever offset it is given: the file is 8192 bytes until it
# is cut back. A kill there leaves 8192.
import os

os.makedirs("ckpts")
fd = os.open("ckpts/w", os.O_RDWR | os.O_CREAT, 0o644)
os.write(fd, b"A" * 4096)
os.pwritev(fd, [b"B" * 4096], 0, os.RWF_APPEND)  # at 4096, not 0
os.fsync(fd)
os.ftruncate(fd, 4096)
os.pwrite(fd, b"B" * 4096, 0)
os.fsync(fd)
d = os.open("ckpts", os.O_RDONLY)
os.fsync(d)
