# 22 nested directories of 202-character names (past PATH_MAX), made and entered by
# descriptor; the weights written at the bottom and renamed into place, never fsynced
import os

os.mkdir("ckpts")
fd = os.open("ckpts", os.O_RDONLY)
for i in range(22):
    name = f"{i:02d}" + "d" * 200
    os.mkdir(name, dir_fd=fd)
    sub = os.open(name, os.O_RDONLY, dir_fd=fd)
    os.close(fd)
    fd = sub
w = os.open("weights.tmp", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd)
os.write(w, b"w" * 4096)
os.close(w)
os.rename("weights.tmp", "weights.bin", src_dir_fd=fd, dst_dir_fd=fd)
