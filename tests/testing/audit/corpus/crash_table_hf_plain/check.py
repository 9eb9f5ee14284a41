# resume_from_checkpoint=True: get_last_checkpoint (the highest checkpoint-<step>/), then
# every file loaded; exit non-zero when it cannot resume or holds bytes of no single save.
import json
import os
import pickle
import re
import sys

root = sys.argv[1]
found = [n for n in os.listdir(root) if re.fullmatch(r"checkpoint-\d+", n)]
found = [n for n in found if os.path.isdir(os.path.join(root, n))]
if not found:
    sys.exit(0)
d = os.path.join(root, max(found, key=lambda n: int(n.split("-")[1])))
try:
    with open(os.path.join(d, "trainer_state.json")) as f:
        k = json.load(f)["k"]
    with open(os.path.join(d, "model.safetensors"), "rb") as f:
        assert f.read() == bytes([k]) * 2048, "model of another save"
    with open(os.path.join(d, "optimizer.pt"), "rb") as f:
        assert pickle.load(f) == [k] * 3000, "optimizer of another save"
    with open(os.path.join(d, "scheduler.pt"), "rb") as f:
        assert pickle.load(f) == {"k": k}, "scheduler of another save"
except Exception as exc:
    sys.exit(f"cannot resume from {d}: {exc!r}")
