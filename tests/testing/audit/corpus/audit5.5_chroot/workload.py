# After chroot(".") the path /ckpts/w names ckpts/w: it is unlinked and re-created, so it is
# empty until the write. A kill there leaves it empty. (Needs root, or a user namespace.)
import os

pid = os.fork()
if pid == 0:
    os.chroot(".")
    os.unlink("/ckpts/w")
    fd = os.open("/ckpts/w", os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"A" * 4096)
    os.fsync(fd)
    d = os.open("/ckpts", os.O_RDONLY)
    os.fsync(d)
    os._exit(0)
os.waitpid(pid, 0)
