# The crash table's torchsave_plain row (benchmarks/crash_table/torchsave_plain.py),
# copied without torch to stay fast: each save writes ckpts/ckpt/ckpt-<step>.pt in place
# (torch.save's pattern: open the final name, write); three saves: a normal one, a
# rewrite of that step, and one the full disk (a file size limit) cuts short.
import contextlib
import os
import pickle
import resource
import signal

STEPS = {1: 10, 2: 10, 3: 20}


def state(k):
    return {"model": [k] * 200, "optim": [k] * 2000, "step": STEPS[k], "k": k}


def save(k):
    os.makedirs(os.path.join("ckpts", "ckpt"), exist_ok=True)
    with open(os.path.join("ckpts", "ckpt", f"ckpt-{STEPS[k]}.pt"), "wb") as f:
        pickle.dump(state(k), f)


save(1)
save(2)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (len(pickle.dumps(state(3))) // 2, -1))
with contextlib.suppress(OSError):  # the disk is full: the save fails, the job goes on
    save(3)
