# a FIFO already in the audited directory: copying it would block until a writer came
import os

with open(os.path.join("ckpts", "weights.bin"), "wb") as f:
    f.write(b"w" * 8192)
