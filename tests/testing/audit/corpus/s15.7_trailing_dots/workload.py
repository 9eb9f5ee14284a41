# a file whose name ends in "..." (strace's own ellipsis), written and never fsynced
import os

os.makedirs("ckpts/1")
with open("ckpts/1/w...", "wb") as f:
    f.write(b"w" * 100)
