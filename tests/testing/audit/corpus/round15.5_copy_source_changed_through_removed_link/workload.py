# a staging directory outside ckpts/, reached also through a symlink (and a hard link):
# step 1's (wrong) bytes copied in by sendfile and marked DONE; then the staging file is
# replaced through the other spelling before step 2; step 1 pruned (its marker first)
import os
import shutil

how = "hardlink"


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def save(step):
    os.makedirs(f"ckpts/{step}")
    fsync_dir("ckpts")
    src = os.open("stage/w.bin", os.O_RDONLY)
    w = os.open(f"ckpts/{step}/w.bin", os.O_WRONLY | os.O_CREAT, 0o644)
    os.sendfile(w, src, 0, 4096)
    os.fsync(w)
    os.close(w)
    os.close(src)
    m = os.open(f"ckpts/{step}/DONE", os.O_WRONLY | os.O_CREAT, 0o644)
    os.fsync(m)
    os.close(m)
    fsync_dir(f"ckpts/{step}")


os.makedirs("stage", exist_ok=True)
with open("stage/w.bin", "wb") as f:
    f.write(b"x" * 4096)  # step 1's weights: wrong, what the check rejects
if how == "symlink":
    os.symlink("stage", "alias")
else:
    os.link("stage/w.bin", "alias.bin")
save(1)
if how == "symlink":
    with open("alias/new.tmp", "wb") as f:
        f.write(b"g" * 4096)
    os.rename("alias/new.tmp", "alias/w.bin")  # spelled through the symlink
else:
    fd = os.open("alias.bin", os.O_WRONLY)  # the same file by its other name
    os.pwrite(fd, b"g" * 4096, 0)
    os.close(fd)
save(2)
os.unlink("ckpts/1/DONE")
fsync_dir("ckpts/1")
shutil.rmtree("ckpts/1")
fsync_dir("ckpts")
os.unlink("alias.bin")  # the other name gone by the end: nothing left to compare
