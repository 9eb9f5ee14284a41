# A thread fsyncs weights.bin while the main thread writes its tail; then DONE is written
# and fsynced. The tail completed while the fsync ran, so the fsync does not cover it
# (fsync makes durable what was written before it began): a power loss may keep DONE and
# lose the tail. The main thread writes only once the syncing thread waits on the disk.
import os
import threading
import time

os.makedirs("ckpts")
d = os.open("ckpts", os.O_RDONLY)
fd = os.open("ckpts/weights.bin", os.O_WRONLY | os.O_CREAT, 0o644)
src = os.open("bulk.src", os.O_RDONLY)
left = 32 << 20
while left:
    left -= os.copy_file_range(src, fd, left)
syncer: list[int] = []


def sync() -> None:
    syncer.append(threading.get_native_id())
    os.fsync(fd)


t = threading.Thread(target=sync)
t.start()
while not syncer:
    time.sleep(0.0005)
deadline = time.monotonic() + 10
while t.is_alive() and time.monotonic() < deadline:  # until the fsync waits on the disk
    with open(f"/proc/self/task/{syncer[0]}/stat") as f:
        if f.read().rsplit(")", 1)[1].split()[0] == "D":
            break
os.write(fd, b"T" * 4096)  # the tail, while the fsync runs (or after it: broken as well)
t.join()
m = os.open("ckpts/DONE", os.O_WRONLY | os.O_CREAT, 0o644)
os.fsync(m)
os.fsync(d)
