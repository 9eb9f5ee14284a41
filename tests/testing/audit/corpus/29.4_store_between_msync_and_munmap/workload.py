# Stores between the only msync and the munmap, with no system call between them: only
# the bytes stored before the msync are flushed by it. m.bin holds "a"s durably, the "b"s
# stored after it are never synced; the DONE marker then is. The old model credited the
# final bytes (the "b"s) to the msync MS_SYNC: every state looked durable, a false clean.
import ctypes
import os

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]  # fmt: skip
libc.msync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
PROT_RW, MAP_SHARED, MS_SYNC, N = 0x3, 0x1, 0x4, 4096

os.makedirs("ckpts")
fd = os.open("ckpts/m.bin", os.O_RDWR | os.O_CREAT, 0o644)
os.ftruncate(fd, N)
os.fsync(fd)
base = libc.mmap(None, N, PROT_RW, MAP_SHARED, fd, 0)
assert base not in (None, ctypes.c_void_p(-1).value)
ctypes.memset(base, ord("a"), N)
assert libc.msync(base, N, MS_SYNC) == 0
ctypes.memset(base, ord("b"), N)  # no system call between the msync and the munmap
assert libc.munmap(base, N) == 0
os.close(fd)
with open("ckpts/DONE", "wb") as f:
    f.write(b"ok")
    os.fsync(f.fileno())
d = os.open("ckpts", os.O_RDONLY)
os.fsync(d)
os.close(d)
