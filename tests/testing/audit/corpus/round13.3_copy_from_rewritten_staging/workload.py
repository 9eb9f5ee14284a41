# each step: the weights staged in one file outside the root (rewritten every step), then
# copied over ckpts/ckpt.bin in place (copy_file_range) and fsynced: a kill in step 2's
# copy leaves ckpt.bin half step 2, half step 1, and the audit must not take step 2's
# bytes for step 1's copy
import os

root = "ckpts"
os.makedirs(root)
for step in (1, 2):
    with open("staging.bin", "wb") as f:
        f.write(bytes([step]) * 65536)
    src = os.open("staging.bin", os.O_RDONLY)
    dst = os.open(os.path.join(root, "ckpt.bin"), os.O_WRONLY | os.O_CREAT, 0o644)
    left = 65536
    while left:
        left -= os.copy_file_range(src, dst, left)
    os.fsync(dst)
    os.close(src)
    os.close(dst)
