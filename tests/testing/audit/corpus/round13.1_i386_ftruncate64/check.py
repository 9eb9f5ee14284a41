# ckpt.bin holds a whole 4096-byte checkpoint
import os
import sys

size = os.path.getsize(os.path.join(sys.argv[1], "ckpt.bin"))
if size != 4096:
    sys.exit(f"ckpt.bin holds {size} bytes")
