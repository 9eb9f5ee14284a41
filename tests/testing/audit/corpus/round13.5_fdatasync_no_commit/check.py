# latest.txt names a whole checkpoint (unreadable: the resume scans instead)
import os
import sys

root = sys.argv[1]
with open(os.path.join(root, "latest.txt"), "rb") as f:
    n = f.read().strip()
if n.isdigit():
    path = os.path.join(root, f"ckpt-{n.decode()}")
    if not os.path.exists(path):
        sys.exit(f"latest.txt names ckpt-{n.decode()}, which is gone")
