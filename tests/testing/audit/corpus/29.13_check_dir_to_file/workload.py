# d/x put in place by a rename, then rewritten in place (O_TRUNC): a kill leaves it short.
import os

os.makedirs("ckpts/d")
with open("ckpts/tmp", "wb") as f:
    f.write(b"x" * 100)
os.rename("ckpts/tmp", "ckpts/d/x")
with open("ckpts/d/x", "wb") as f:
    f.write(b"y" * 100)
