# A naive save that leaves a detached daemon (a metrics uploader) running: the recording
# must be bounded (--record-timeout) and name it, not wait forever.
import json
import os
import subprocess
import sys

os.makedirs("ckpts/1", exist_ok=True)
with open("ckpts/1/weights.bin", "wb") as f:
    f.write(b"\x01" * 4096)
with open("ckpts/1/meta.json", "w") as f:
    json.dump({"step": 1, "size": 4096}, f)
subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(300)"],
    start_new_session=True,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
)
