import os

os.makedirs("ckpts")
with open("ckpts/w", "wb") as f:
    f.write(b"A" * 4096)
