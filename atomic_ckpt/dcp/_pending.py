"""One async DCP save per root at a time, in this process: which save of a root is still
running, and what a new :class:`atomic_ckpt.dcp.AtomicWriter` of that root does about it
(``on_pending``: wait for it, or raise :class:`PendingSaveError` on every rank).

(Private: imported by :mod:`atomic_ckpt.dcp` after its torch version check.)
"""

from __future__ import annotations

import threading
import time
import weakref
from pathlib import Path
from typing import Literal

from atomic_ckpt import CheckpointDir, CheckpointTimeoutError, CommitStateError
from atomic_ckpt.distributed._ranks import _Ranks


class PendingSaveError(CommitStateError):
    """A new DCP save was started while this process's previous async save of the same
    root is still running, and the writer was made with ``on_pending="raise"``."""


_LAST: weakref.WeakValueDictionary[Path, _PendingSaves] = weakref.WeakValueDictionary()
"""This process's latest async writer per root (see _PendingSaves._wait_for_previous)."""
_LAST_LOCK = threading.Lock()
_EXIT_GRACE = 1.0
"""Seconds ``on_pending="raise"`` allows a finished async save's thread to exit."""


class _PendingSaves:
    """AtomicWriter's part that tracks its async save and waits for the previous one.

    The writer sets these attributes; ``_thread`` is the thread that runs its save (for an
    async save, torch's executor, whose end a later save waits for) and ``_async`` says
    that an async save was staged and so may still run.
    """

    ckpts: CheckpointDir
    step: int
    timeout: float
    on_pending: Literal["wait", "raise"]
    _distributed: bool
    _control: _Ranks
    _thread: threading.Thread | None
    _async: bool

    def _begin_async(self) -> None:
        """This writer's async save is being staged: from here on, it is pending."""
        # Again here: a writer made before the previous save was staged (both made up
        # front) saw nothing pending then, and must not copy into buffers still being read.
        self._wait_for_previous()
        self._async = True
        with _LAST_LOCK:
            _LAST[self.ckpts.root] = self

    def _wait_for_previous(self) -> None:
        """Apply ``on_pending`` to this process's previous async save of the same root."""
        with _LAST_LOCK:
            previous = _LAST.get(self.ckpts.root)
        if self.on_pending == "raise":
            pending = previous is not None and previous._pending(grace=_EXIT_GRACE)
            if self._distributed:
                pending = any(self._control.all_gather(pending, "checking for a pending save"))
            if pending:
                raise PendingSaveError(
                    f"the previous async DCP save into {self.ckpts.root} is still running "
                    "(on_pending='raise'): wait for its future, or make the writer with "
                    "on_pending='wait'",
                    path=self.ckpts.root,
                    step=self.step,
                )
        elif previous is not None:
            previous._wait(self.timeout)

    def _pending(self, grace: float = 0.0) -> bool:
        """The async save still runs: its thread (torch's executor) has not ended. That
        thread resolves the save's future and only then exits, so ``grace`` seconds are
        allowed for it to end (a caller that waited for the future is not pending)."""
        thread = self._thread
        if thread is threading.current_thread() or not self._async:
            return False
        if thread is None:
            return True
        ended = _ended(thread)
        return not ended.wait(grace) if grace > 0 else not ended.is_set()

    def _wait(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        while self._pending() and time.monotonic() < end:
            thread = self._thread
            if thread is None:
                time.sleep(0.01)  # staged, not started yet
            else:
                _ended(thread).wait(max(0.0, end - time.monotonic()))
        if self._pending():
            raise CheckpointTimeoutError(
                f"the previous async DCP save of step {self.step} into {self.ckpts.root} "
                f"did not end within {timeout:g}s (the new writer's timeout); wait for its "
                "future before starting another save",
                path=self.ckpts.root,
                step=self.step,
            )


_ENDED: weakref.WeakKeyDictionary[threading.Thread, threading.Event] = weakref.WeakKeyDictionary()
_ENDED_LOCK = threading.Lock()


def _ended(thread: threading.Thread) -> threading.Event:
    """An Event set once ``thread`` has ended, by a watcher thread that joins it.

    The caller waits on the Event, never in ``Thread.join`` (nor ``is_alive``): on CPython
    before 3.13 a KeyboardInterrupt landing inside those marks the thread as stopped, so
    interpreter exit no longer waits for it and the save in flight is cut off. Only the
    main thread gets KeyboardInterrupt, so the watcher's join is never interrupted. Where
    no thread can be started (interpreter shutdown), a briefly joined snapshot instead
    (the callers look again)."""
    with _ENDED_LOCK:
        event = _ENDED.get(thread)
        if event is not None:
            return event
        event = _ENDED[thread] = threading.Event()

    def watch() -> None:
        thread.join()
        event.set()

    try:
        threading.Thread(target=watch, name="atomic_ckpt-dcp-watch", daemon=True).start()
    except RuntimeError:  # interpreter shutdown: no new threads
        with _ENDED_LOCK:
            del _ENDED[thread]
        thread.join(0.05)
        if not thread.is_alive():
            event.set()
    return event
