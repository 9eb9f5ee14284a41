# staged in ckpts/staging/5/, promoted by a rename to ckpts/5/: the relative link
# ../../blobs/abc led to ckpts/blobs/abc while staged, to ../blobs/abc (outside) after
import os

os.makedirs("ckpts/staging/5")
os.makedirs("blobs")
with open("blobs/abc", "wb") as f:
    f.write(b"w" * 100)
os.symlink("../../blobs/abc", "ckpts/staging/5/model.bin")
os.rename("ckpts/staging/5", "ckpts/5")
d = os.open("ckpts", os.O_RDONLY)
os.fsync(d)
os.close(d)
