# a content-store layout: ckpts/model.bin -> ../blobs/abc, whose target the crash states cannot hold
import os

root = "ckpts"
os.makedirs(root)
os.makedirs("blobs")
with open("blobs/abc", "wb") as f:
    f.write(b"w" * 100)
os.symlink("../blobs/abc", os.path.join(root, "model.bin"))
