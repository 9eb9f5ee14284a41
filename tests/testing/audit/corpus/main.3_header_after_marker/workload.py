# the body, then another file, then the first file's header: three operations, no fsync;
# the header's operation kept must not bring back the body's if that one was lost
import os
import struct

os.makedirs("ckpts")
fd = os.open(os.path.join("ckpts", "blob"), os.O_WRONLY | os.O_CREAT, 0o644)
os.pwrite(fd, b"b" * 8192, 8)
with open(os.path.join("ckpts", "notes.txt"), "w") as f:
    f.write("saved")
os.pwrite(fd, b"HDR!" + struct.pack("<I", 8192), 0)
os.close(fd)
