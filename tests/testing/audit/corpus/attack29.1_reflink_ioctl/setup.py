# The checkpoint the user already has: ckpts/w, good.
import os

os.makedirs("ckpts")
with open("ckpts/w", "wb") as f:
    f.write(b"GOOD" * 1024)
