# The crash table's torchsave_plain check, without torch: load the newest ckpt-<step>.pt
# as a resuming job would.
import os
import pickle
import sys

ckpt = os.path.join(sys.argv[1], "ckpt")
names = os.listdir(ckpt) if os.path.isdir(ckpt) else []
found = [
    (int(n[5:-3]), n)
    for n in names
    if n.startswith("ckpt-") and n.endswith(".pt") and n[5:-3].isdigit()
]
if not found:
    sys.exit(0)
path = os.path.join(ckpt, max(found)[1])
try:
    with open(path, "rb") as f:
        saved = pickle.load(f)
    k = saved["k"]
    if saved["model"] != [k] * 200 or saved["optim"] != [k] * 2000:
        raise ValueError("the file mixes saves")
except Exception as exc:
    sys.exit(f"VIOLATION cannot load {path}: {type(exc).__name__}: {exc}")
