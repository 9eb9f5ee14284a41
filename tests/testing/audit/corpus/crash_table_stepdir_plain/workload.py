# The crash table's stepdir_plain row (benchmarks/crash_table/stepdir_plain.py), copied
# without torch to stay fast: ckpts/ckpt/<step>/ gets model.pt, optim.pt and meta.json
# written into it; three saves: a normal one, a rewrite of that step, and one that fails
# part-way through its optim.pt because the disk fills up (a file size limit).
import contextlib
import json
import os
import pickle
import resource
import signal

STEPS = {1: 10, 2: 10, 3: 20}


def state(k):
    return {"model": [k] * 200, "optim": [k] * 2000, "step": STEPS[k]}


def save(k):
    saved = state(k)
    directory = os.path.join("ckpts", "ckpt", str(saved["step"]))
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "model.pt"), "wb") as f:
        pickle.dump(saved["model"], f)
    with open(os.path.join(directory, "optim.pt"), "wb") as f:
        pickle.dump(saved["optim"], f)
    with open(os.path.join(directory, "meta.json"), "w") as f:
        json.dump({"step": saved["step"], "k": k}, f)


save(1)
save(2)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (len(pickle.dumps(state(3)["optim"])) // 2, -1))
with contextlib.suppress(OSError):  # the disk is full: the save fails, the job goes on
    save(3)
