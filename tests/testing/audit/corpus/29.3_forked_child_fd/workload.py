# a parent's fsync of its fd 3 does not sync a forked child's fd 3
import os

root = "ckpts"
os.makedirs(root)
fd = os.open(os.path.join(root, "a.bin"), os.O_WRONLY | os.O_CREAT, 0o644)
pid = os.fork()
if pid == 0:
    os.close(fd)
    b = os.open(os.path.join(root, "b.bin"), os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(b, b"b" * 4096)
    os._exit(0)
os.waitpid(pid, 0)
os.fsync(fd)
open(os.path.join(root, "OK"), "w").close()
d = os.open(root, os.O_RDONLY)
os.fsync(d)
os.close(d)
