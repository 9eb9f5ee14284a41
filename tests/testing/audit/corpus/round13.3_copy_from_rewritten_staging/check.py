# ckpt.bin, if there, holds one step's weights (a stand-in for a checksum check)
import os
import sys

path = os.path.join(sys.argv[1], "ckpt.bin")
if os.path.exists(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(set(data)) > 1:
        sys.exit(f"ckpt.bin mixes steps {sorted(set(data))}")
