# A thread overwrites w in place while the main thread renames DONE away once the copy has
# begun: the copy completes after the rename, but a kill while it runs, before the rename,
# leaves DONE beside a half-new w. (--models kill: the crash table's kill-only audit.)
import os
import threading
import time

fd = os.open("ckpts/w", os.O_WRONLY)
src = os.open("bulk.src", os.O_RDONLY)
began: list[int] = []


def copy() -> None:
    began.append(threading.get_native_id())
    left = 32 << 20
    while left:
        left -= os.copy_file_range(src, fd, left)


t = threading.Thread(target=copy)
t.start()
while not began:
    time.sleep(0.0001)
deadline = time.monotonic() + 10
while t.is_alive() and time.monotonic() < deadline:  # until the copy runs in the kernel
    try:
        with open(f"/proc/self/task/{began[0]}/syscall") as f:
            if f.read().split()[0] == "326":  # copy_file_range on x86_64
                break
    except OSError:  # the thread ended meanwhile: the copy is done (DONE beside a new w)
        break
os.rename("ckpts/DONE", "ckpts/DONE.old")
t.join()
