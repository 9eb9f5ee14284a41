# A helper process opens the checkpoint and passes the descriptor over a Unix socket
# (SCM_RIGHTS); the trainer overwrites it in place through it: scratch bytes first (at the
# shared offset, 0), then the good bytes and a sync. A kill between the two leaves the
# scratch bytes. The receiving process's table never opened the file.
import os
import socket

ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
pid = os.fork()
if pid == 0:
    fd = os.open("ckpts/w", os.O_RDWR)
    socket.send_fds(theirs, [b"x"], [fd])
    os._exit(0)
os.waitpid(pid, 0)
_, (fd,), _, _ = socket.recv_fds(ours, 1, 1)
os.write(fd, b"BAD!" * 1024)
os.lseek(fd, 0, os.SEEK_SET)
os.write(fd, b"GOOD" * 1024)
os.ftruncate(fd, 4096)
os.fsync(fd)
