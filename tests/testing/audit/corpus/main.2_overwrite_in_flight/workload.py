# old contents, rewritten in place (a shorter write over its start), then a marker;
# nothing fsynced: a power loss may keep the older write and lose the newer one
import os

os.makedirs("ckpts")
fd = os.open(os.path.join("ckpts", "state"), os.O_WRONLY | os.O_CREAT, 0o644)
os.write(fd, b"step=1;" + b"o" * 57)
os.pwrite(fd, b"step=2;" + b"n" * 9, 0)
os.close(fd)
with open(os.path.join("ckpts", "LATEST"), "w") as f:
    f.write("2")
