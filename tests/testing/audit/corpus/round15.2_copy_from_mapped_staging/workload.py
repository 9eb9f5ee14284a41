# a staging file outside ckpts/, mapped shared and reused per save: step 1's (wrong)
# bytes copied in by sendfile and marked DONE, then step 2's stored through the mapping
# (no system call), copied in and marked; step 1 pruned (its marker first) at the end
import mmap
import os
import shutil


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def save(step, stage):
    os.makedirs(f"ckpts/{step}")
    fsync_dir("ckpts")
    w = os.open(f"ckpts/{step}/w.bin", os.O_WRONLY | os.O_CREAT, 0o644)
    os.sendfile(w, stage, 0, 4096)
    os.fsync(w)
    os.close(w)
    m = os.open(f"ckpts/{step}/DONE", os.O_WRONLY | os.O_CREAT, 0o644)
    os.fsync(m)
    os.close(m)
    fsync_dir(f"ckpts/{step}")


stage = os.open("stage.bin", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(stage, b"x" * 4096)  # step 1's weights: wrong, what the check rejects
mapping = mmap.mmap(stage, 4096)
save(1, stage)
mapping[:] = b"g" * 4096  # step 2's weights, through the mapping
save(2, stage)
os.unlink("ckpts/1/DONE")
fsync_dir("ckpts/1")
shutil.rmtree("ckpts/1")
fsync_dir("ckpts")
