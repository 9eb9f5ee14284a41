# A naive save next to an 8 TiB sparse file (a hole, nothing on disk): the model holds it
# by the data it has, not its size, and judges the save (broken: a kill after the mkdir).
import os

os.makedirs("ckpts/1", exist_ok=True)
fd = os.open("ckpts/huge.bin", os.O_WRONLY | os.O_CREAT, 0o644)
os.ftruncate(fd, 8 << 40)
os.close(fd)
with open("ckpts/1/weights.bin", "wb") as f:
    f.write(b"\x01" * 4096)
with open("ckpts/1/meta.json", "w") as f:
    f.write('{"step": 1, "size": 4096}')
