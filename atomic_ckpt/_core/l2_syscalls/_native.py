"""The ctypes calls behind fs.py (renameat2, sync_file_range), loaded once at import."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_SYS_RENAMEAT2 = {"x86_64": 316, "aarch64": 276, "riscv64": 276, "ppc64le": 357, "s390x": 347}

_CAN_FSYNC_DIRS = sys.platform != "win32"
_FULLFSYNC: int | None = (
    getattr(__import__("fcntl"), "F_FULLFSYNC", None) if (sys.platform == "darwin") else None
)


def _load_renameat2() -> Callable[[bytes, bytes, int], int] | None:
    """A callable ``(old, new, flags) -> 0 or -1`` for renameat2, or None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is not None:  # glibc >= 2.28
        fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        fn.restype = ctypes.c_int

        def via_libc(old: bytes, new: bytes, flags: int) -> int:
            return int(fn(_AT_FDCWD, old, _AT_FDCWD, new, flags))

        return via_libc
    nr = _SYS_RENAMEAT2.get(platform.machine())
    if nr is None:
        return None
    syscall = libc.syscall
    syscall.restype = ctypes.c_long

    def via_syscall(old: bytes, new: bytes, flags: int) -> int:
        return int(
            syscall(
                ctypes.c_long(nr),
                ctypes.c_int(_AT_FDCWD),
                ctypes.c_char_p(old),
                ctypes.c_int(_AT_FDCWD),
                ctypes.c_char_p(new),
                ctypes.c_uint(flags),
            )
        )

    return via_syscall


_renameat2 = _load_renameat2()


def _load_sync_file_range() -> Callable[[int, int, int], int] | None:
    """A callable ``(fd, offset, length) -> 0 or -1`` starting writeback, or None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    fn = getattr(libc, "sync_file_range", None)
    if fn is None:
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int

    def start(fd: int, offset: int, length: int) -> int:
        return int(fn(fd, offset, length, _SYNC_FILE_RANGE_WRITE))

    return start


_SYNC_FILE_RANGE_WRITE = 2
_sync_file_range = _load_sync_file_range()


def _renameat2_or_raise(src: Path, dst: Path, flags: int) -> None:
    assert _renameat2 is not None
    if _renameat2(os.fsencode(src), os.fsencode(dst), flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(src), None, str(dst))
