# The audited directory's parent is renamed away (no out/ckpts at all) and back; meanwhile
# w is re-created through the other spelling, empty until the write.
import os

os.rename("out", "out.moving")
os.unlink("out.moving/ckpts/w")
fd = os.open("out.moving/ckpts/w", os.O_WRONLY | os.O_CREAT, 0o644)
os.rename("out.moving", "out")
os.write(fd, b"A" * 4096)
os.fsync(fd)
d = os.open("out/ckpts", os.O_RDONLY)
os.fsync(d)
