# the weights live in ../blobs (a content store), reached from ckpts/model.bin through
# ckpts/here -> . (the kernel follows here before the ..); the blob is never fsynced
import os

os.makedirs("ckpts")
os.makedirs("blobs")
with open("blobs/abc", "wb") as f:
    f.write(b"w" * 100)
os.symlink(".", "ckpts/here")
os.symlink("here/../blobs/abc", "ckpts/model.bin")
d = os.open("ckpts", os.O_RDONLY)
os.fsync(d)
os.close(d)
