"""Module-level thread locks that a child forked while another thread held one finds free.

``os.fork`` copies a held :class:`threading.Lock` as held, and the thread that held it does
not exist in the child: the child's first commit (a DataLoader worker forked at the instant
an async commit of the trainer registers or ends) would wait for it forever. Each
:class:`ProcessLock` is replaced by a fresh lock in the child, as :mod:`logging` does with
its own. The state it guards is the parent's at the fork: a dict or set changed under the
GIL is never half-updated, so nothing else needs repair.
"""

from __future__ import annotations

import os
import threading
import weakref
from types import TracebackType

__all__ = ["ProcessLock"]

_ALL: weakref.WeakSet[ProcessLock] = weakref.WeakSet()


class ProcessLock:
    """A :class:`threading.Lock` (``with``, :meth:`acquire`, :meth:`release`) that is free
    in a child forked while it was held."""

    __slots__ = ("__weakref__", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        _ALL.add(self)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Take the lock, as :meth:`threading.Lock.acquire`."""
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        """Release the lock, as :meth:`threading.Lock.release`."""
        self._lock.release()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._lock.release()


def _reset_in_child() -> None:
    for lock in list(_ALL):
        lock._lock = threading.Lock()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_reset_in_child)
