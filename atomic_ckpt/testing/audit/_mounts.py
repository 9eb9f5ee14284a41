"""Mounts at or below the audited directory, read from ``/proc/self/mountinfo``.

``os.path.ismount`` misses a bind mount of a directory on the same filesystem (same
device, another inode), and ``shutil.rmtree`` descends into any mount: a workload (or a
check) that mounts a directory inside the tree would have the audit delete the mounted
directory's files, outside the tree, when it clears the tree (round 13, defect 2).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
from pathlib import Path

from atomic_ckpt.testing.audit._errors import AuditError

_MNT_DETACH = 2
_OCTAL = re.compile(r"\\([0-7]{3})")


def _points() -> list[str]:
    """Every mount point of this process's mount namespace (none off Linux)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    return [_OCTAL.sub(lambda m: chr(int(m[1], 8)), line.split(" ")[4]) for line in lines]


def is_mount_point(path: Path) -> bool:
    """``path`` is a mount point, a bind mount from the same filesystem included."""
    real = os.path.realpath(path)
    return os.path.ismount(path) or real in _points()


def mounts_below(path: Path) -> list[str]:
    """The mount points strictly below ``path``, deepest first."""
    real = os.path.realpath(path)
    below = {p for p in _points() if p.startswith(real + "/")}
    return sorted(below, key=lambda p: p.count("/"), reverse=True)


def detach_mounts(path: Path) -> None:
    """Detach every mount below ``path`` (a workload's or a check's: refused anyway), so
    that clearing the tree never reaches into what is mounted there; raise
    :class:`AuditError` when one cannot be detached (then nothing may be removed)."""
    below = mounts_below(path)
    if not below:
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    for point in below:
        if libc.umount2(os.fsencode(point), _MNT_DETACH) != 0:
            err = ctypes.get_errno()
            raise AuditError(
                f"{point} is a mount inside the audited directory that the audit cannot "
                f"detach ({os.strerror(err)}); the directory was left as it is, so as "
                f"not to delete what is mounted there: unmount it, then move the original "
                f"back from the audit's private directory"
            )
