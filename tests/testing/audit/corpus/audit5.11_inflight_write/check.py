# DONE promises w whole and old: 32 MiB of o.
import os
import sys

root = sys.argv[1]
if os.path.exists(os.path.join(root, "DONE")):
    with open(os.path.join(root, "w"), "rb") as f:
        sys.exit(f.read() != b"o" * (32 << 20))
