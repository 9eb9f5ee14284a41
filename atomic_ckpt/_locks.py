"""The lock files of a root, through ``filelock``.

A writer holds ``N.tmp-<token>.lock`` for the whole of its save and removes
it (while still holding it) when it is done; ``clean()`` takes the lock of a
staging dir before touching it, so a live save is never removed. A lock held
by a dead process is free: the kernel drops flock locks with the process.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from filelock import FileLock, Timeout

__all__ = ["drop", "is_held", "new", "try_acquire"]


def new(path: Path, timeout: float) -> FileLock:
    """A fresh lock object for ``path``.

    One per acquisition: each holds its own descriptor, so threads of one
    process exclude each other as processes do (a shared FileLock is reentrant).
    """
    return FileLock(path, timeout=timeout, thread_local=False)


def try_acquire(path: Path) -> FileLock | None:
    """Acquire ``path`` if it is free (creating it if missing); None if someone holds it."""
    lock = new(path, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        return None
    return lock


def is_held(path: Path) -> bool:
    """Does a live process hold the lock file ``path``? False if it does not exist."""
    if not path.exists():
        return False
    try:
        lock = try_acquire(path)
    except OSError:
        return True  # cannot tell (e.g. a read-only root): assume it is live
    if lock is None:
        return True
    lock.release()
    return False


def drop(lock: FileLock) -> None:
    """Remove a per-token lock's file while still holding it, then release it.

    Never used for the root lock: deleting a lock file another process waits on
    would let two processes hold "the" lock at once.
    """
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock.lock_file)
    finally:
        lock.release()  # even if the unlink failed (EIO, EROFS): never leak the lock
