# the workload makes a FIFO under the audited directory (mkfifo is mknodat)
import os

os.makedirs("ckpts")
with open(os.path.join("ckpts", "weights.bin"), "wb") as f:
    f.write(b"w" * 8192)
os.mkfifo(os.path.join("ckpts", "pipe"))
