# The crash table's hf_plain row (benchmarks/crash_table/hf_plain.py), its file pattern
# copied without torch or transformers: a plain Trainer writes checkpoint-<step>/ in place
# (model, optimizer, scheduler, trainer state); three saves: a normal one, one more, and
# one the full disk (a file size limit) cuts short in its optimizer file.
import contextlib
import json
import os
import pickle
import resource
import signal


def save(step, k):
    d = os.path.join("ckpts", f"checkpoint-{step}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(bytes([k]) * 2048)
    with open(os.path.join(d, "optimizer.pt"), "wb") as f:
        pickle.dump([k] * 3000, f)
    with open(os.path.join(d, "scheduler.pt"), "wb") as f:
        pickle.dump({"k": k}, f)
    with open(os.path.join(d, "trainer_state.json"), "w") as f:
        json.dump({"global_step": step, "k": k}, f)


save(10, 1)
save(20, 2)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (len(pickle.dumps([3] * 3000)) // 2, -1))
with contextlib.suppress(OSError):  # the disk is full: the save fails, the job goes on
    save(30, 3)
