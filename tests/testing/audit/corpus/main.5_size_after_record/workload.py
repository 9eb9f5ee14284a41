# a record into slot 0, an index file, then ftruncate extends the file to two slots (the
# size says "slot 0 done"); nothing fsynced: the size may persist over a torn record
import os

os.makedirs("ckpts")
fd = os.open(os.path.join("ckpts", "slots"), os.O_WRONLY | os.O_CREAT, 0o644)
os.write(fd, b"r" * 4096)
with open(os.path.join("ckpts", "index"), "w") as f:
    f.write("1")
os.ftruncate(fd, 8192)
os.close(fd)
