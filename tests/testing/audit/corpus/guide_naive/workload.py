# train.py of docs/guides/audit.md: each checkpoint's files written straight into ckpts/<step>/
import json
import os

for step in (1, 2, 3):
    directory = os.path.join("ckpts", str(step))
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "weights.bin"), "wb") as f:
        f.write(bytes([step]) * 4096)
    with open(os.path.join(directory, "meta.json"), "w") as f:
        json.dump({"step": step, "size": 4096}, f)
