# A reflink (cp --reflink, FICLONE) of scratch bytes over the checkpoint, then the good
# bytes written back and synced: a kill between the two leaves the scratch bytes. The
# ioctl is no write the trace can show. Where the filesystem cannot reflink (ext4), the
# scratch bytes are written instead and the file's flags set with chattr's ioctl
# (FS_IOC_SETFLAGS), another ioctl the audit does not model.
import array
import fcntl
import os

FICLONE, FS_IOC_GETFLAGS, FS_IOC_SETFLAGS = 0x40049409, 0x80086601, 0x40086602
with open("scratch", "wb") as f:
    f.write(b"BAD!" * 1024)
src = os.open("scratch", os.O_RDONLY)
dst = os.open("ckpts/w", os.O_RDWR)
try:
    fcntl.ioctl(dst, FICLONE, src)
except OSError:  # no reflink here
    os.pwrite(dst, b"BAD!" * 1024, 0)
    flags = array.array("l", [0])
    fcntl.ioctl(dst, FS_IOC_GETFLAGS, flags, True)
    fcntl.ioctl(dst, FS_IOC_SETFLAGS, flags, True)
os.pwrite(dst, b"GOOD" * 1024, 0)
os.fsync(dst)
