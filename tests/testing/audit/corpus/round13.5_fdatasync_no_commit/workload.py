# step 2: ckpt-2 written under a temporary name, fsynced and renamed (its directory never
# fsynced: the bug), the metrics record overwritten in place and fdatasynced (on ext4 no
# journal commit: the rename may still be lost), then latest.txt overwritten in place
import os

p = lambda n: os.path.join("ckpts", n)  # noqa: E731
with open(p("ckpt-2.tmp"), "wb") as f:
    f.write(b"2" * 4096)
    f.flush()
    os.fsync(f.fileno())
os.rename(p("ckpt-2.tmp"), p("ckpt-2"))
fd = os.open(p("metrics.bin"), os.O_WRONLY)
os.pwrite(fd, b"loss=0.25", 0)
os.fdatasync(fd)
os.close(fd)
fd = os.open(p("latest.txt"), os.O_WRONLY)
os.pwrite(fd, b"2", 0)
os.close(fd)
