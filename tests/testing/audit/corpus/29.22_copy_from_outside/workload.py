# shutil.copy (sendfile) from outside into the root, never fsynced: modelled, not refused
import os
import shutil

root = "ckpts"
os.makedirs(root)
with open("vocab.src", "w") as f:
    f.write("v" * 5000)
shutil.copy("vocab.src", os.path.join(root, "vocab.txt"))
