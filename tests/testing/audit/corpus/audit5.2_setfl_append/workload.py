# fcntl(F_SETFL, O_APPEND) makes later writes append: after lseek(0) the second write lands
# at 4096, and the file is 8192 bytes until it is cut back. A kill there leaves 8192.
import fcntl
import os

os.makedirs("ckpts")
fd = os.open("ckpts/w", os.O_RDWR | os.O_CREAT, 0o644)
os.write(fd, b"A" * 4096)
fcntl.fcntl(fd, fcntl.F_SETFL, os.O_APPEND)
os.lseek(fd, 0, os.SEEK_SET)
os.write(fd, b"B" * 4096)  # appended
os.fsync(fd)
fcntl.fcntl(fd, fcntl.F_SETFL, 0)
os.ftruncate(fd, 4096)
os.pwrite(fd, b"B" * 4096, 0)
os.fsync(fd)
d = os.open("ckpts", os.O_RDONLY)
os.fsync(d)
