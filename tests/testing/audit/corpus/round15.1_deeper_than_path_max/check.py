# the weights at the bottom, if any, are whole (read by descriptor: the path is too long)
import os
import sys

fd = os.open(sys.argv[1], os.O_RDONLY)
for i in range(22):
    try:
        fd = os.open(f"{i:02d}" + "d" * 200, os.O_RDONLY, dir_fd=fd)
    except FileNotFoundError:
        sys.exit(0)
try:
    w = os.open("weights.bin", os.O_RDONLY, dir_fd=fd)
except FileNotFoundError:
    sys.exit(0)
if os.read(w, 8192) != b"w" * 4096:
    sys.exit("weights.bin is not the 4096 bytes written")
