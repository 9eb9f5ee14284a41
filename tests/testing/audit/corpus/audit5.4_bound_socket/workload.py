# bind() of a Unix socket makes a name in the directory (a socket node) without open or
# mknod; it is there until the unlink. The crash states hold regular files only: refused.
import os
import socket

os.makedirs("ckpts")
s = socket.socket(socket.AF_UNIX)
s.bind("ckpts/control.sock")
with open("ckpts/w", "wb") as f:
    f.write(b"x")
s.close()
os.unlink("ckpts/control.sock")
