# a thread's relative unlink after another thread's chdir happens in the root
import os
import threading

root = "ckpts"
os.makedirs(root)
with open(os.path.join(root, "weights.bin"), "wb") as f:
    f.write(b"w" * 100)
    os.fsync(f.fileno())
open(os.path.join(root, "meta.json"), "w").close()
here = os.getcwd()
os.chdir("/")
go = threading.Event()
t = threading.Thread(target=lambda: (go.wait(), os.unlink("weights.bin")))
t.start()
os.chdir(os.path.join(here, root))
go.set()
t.join()
