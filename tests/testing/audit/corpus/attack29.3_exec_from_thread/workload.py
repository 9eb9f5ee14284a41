# The main thread writes the weights to ckpts/a (descriptor 3) without syncing them. A
# worker thread with a descriptor table of its own (unshare(CLONE_FILES)) opens ckpts/b
# as its descriptor 3 and execs a finisher, which syncs its descriptor 3 (b) and
# publishes a as ckpts/final with a synced rename. The weights in a were never synced:
# a power loss after the rename leaves final without them. The exec'ing thread takes the
# leader's pid; the finisher's descriptor 3 is the thread's, not the leader's.
import ctypes
import os
import sys
import threading

CLONE_FILES = 0x400
FINISH = (
    "import os; os.fsync(3); os.rename('ckpts/a', 'ckpts/final'); "
    "d = os.open('ckpts', os.O_RDONLY); os.fsync(d)"
)
os.makedirs("ckpts")
a = os.open("ckpts/a", os.O_WRONLY | os.O_CREAT, 0o644)
assert a == 3, a
os.write(a, b"W" * 4096)


def finisher() -> None:
    if ctypes.CDLL(None, use_errno=True).unshare(CLONE_FILES) != 0:
        raise OSError(ctypes.get_errno(), "unshare")
    os.close(3)
    b = os.open("ckpts/b", os.O_WRONLY | os.O_CREAT, 0o644)
    assert b == 3, b
    os.set_inheritable(b, True)
    os.write(b, b"b")
    os.execv(sys.executable, [sys.executable, "-c", FINISH])


threading.Thread(target=finisher).start()
threading.Event().wait()
