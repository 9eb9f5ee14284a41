# the user's directory: step 1 saved, latest.txt pointing at it, a metrics record
import os

os.makedirs("ckpts")
with open("ckpts/ckpt-1", "wb") as f:
    f.write(b"1" * 4096)
with open("ckpts/latest.txt", "w") as f:
    f.write("1")
with open("ckpts/metrics.bin", "wb") as f:
    f.write(b"loss=0.50")
