# the guide's naive save: files straight into ckpts/1/, nothing fsynced
import os

os.makedirs("ckpts/1")
with open("ckpts/1/weights.bin", "wb") as f:
    f.write(b"w" * 4096)
