# the user's directory: ckpt.bin, 4096 bytes
import os

os.makedirs("ckpts")
with open("ckpts/ckpt.bin", "wb") as f:
    f.write(b"\1" * 4096)
