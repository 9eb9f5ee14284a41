# io_uring operations are invisible to the trace
import ctypes
import os

root = "ckpts"
os.makedirs(root)
open(os.path.join(root, "x"), "w").close()
ctypes.CDLL(None, use_errno=True).syscall(425, 4, ctypes.create_string_buffer(120))
