import os

os.makedirs("out/ckpts")
with open("out/ckpts/w", "wb") as f:
    f.write(b"A" * 4096)
