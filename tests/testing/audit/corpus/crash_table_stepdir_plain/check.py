# The crash table's stepdir_plain check, without torch: resume from the highest numbered
# directory of ckpt/ and load its three files as a resuming job does.
import json
import os
import pickle
import sys

ckpt = os.path.join(sys.argv[1], "ckpt")
steps = [int(n) for n in os.listdir(ckpt) if n.isdigit()] if os.path.isdir(ckpt) else []
if not steps:
    sys.exit(0)
directory = os.path.join(ckpt, str(max(steps)))
try:
    with open(os.path.join(directory, "meta.json")) as f:
        k = json.load(f)["k"]
    with open(os.path.join(directory, "model.pt"), "rb") as f:
        model = pickle.load(f)
    with open(os.path.join(directory, "optim.pt"), "rb") as f:
        optim = pickle.load(f)
    if model != [k] * 200 or optim != [k] * 2000:
        raise ValueError("the files are of different saves")
except Exception as exc:
    sys.exit(f"VIOLATION cannot load {directory}: {type(exc).__name__}: {exc}")
