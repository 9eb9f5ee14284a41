# resume.py of docs/guides/audit.md: load the newest checkpoint, exit non-zero if it cannot
import json
import os
import sys

root = sys.argv[1]
steps = [int(n) for n in os.listdir(root) if n.isdigit()] if os.path.isdir(root) else []
if not steps:
    sys.exit(0)
directory = os.path.join(root, str(max(steps)))
try:
    with open(os.path.join(directory, "meta.json")) as f:
        meta = json.load(f)
    with open(os.path.join(directory, "weights.bin"), "rb") as f:
        weights = f.read()
    if weights != bytes([meta["step"]]) * meta["size"]:
        raise ValueError(f"weights.bin holds {len(weights)} bytes of the wrong contents")
except (OSError, ValueError) as exc:
    sys.exit(f"cannot resume from {directory}: {exc}")
