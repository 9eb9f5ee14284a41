"""What a background worker (AsyncCommitter, Mirror) does at the end of a ``with`` block,
and at interpreter exit when its last failure was never raised (exit status 1)."""

from __future__ import annotations

import atexit
import logging
import os
import sys
import weakref
from types import TracebackType
from typing import ClassVar, Self

from atomic_ckpt._core.l2_syscalls.forksafe import ProcessLock

_LIVE: weakref.WeakSet[ClosesOnExit] = weakref.WeakSet()
"""Every worker made in this process, to wait for at exit."""

_UNOBSERVED: dict[int, tuple[ClosesOnExit, int, BaseException]] = {}
"""id(worker) -> (worker, step, error) of a failure no call has raised yet. A strong
reference: a worker dropped (garbage-collected) after its work failed is still reported."""

_UNOBSERVED_LOCK = ProcessLock()


class ClosesOnExit:
    """A context manager whose exit is ``close()``: it waits for the work in flight and
    raises its error. If the block itself failed, the block's error is the one raised,
    and close's is attached to it as a note rather than hiding it.

    A subclass calls ``_watch()`` when made, ``_failed(step, error)`` when its background
    work fails and ``_observed()`` when a call raises that error. A failure still
    unobserved at interpreter exit makes the process exit with status 1 (and says
    which step was lost), so a job script cannot mistake it for success.
    """

    _closing_what: ClassVar[str] = "the background work"
    """What failed, in the note attached to the block's error."""

    _failure_what: ClassVar[str] = "the background work"
    """What failed, in the exit message: "<this> of step N failed and nothing waited"."""

    def close(self) -> None:
        raise NotImplementedError

    def _watch(self) -> None:
        """Wait for this worker at interpreter exit and report its unobserved failure."""
        _LIVE.add(self)

    def _join_at_exit(self) -> None:
        """Wait for the work still in flight (without raising its error)."""

    def _failed(self, step: int, error: BaseException) -> None:
        """The background work of ``step`` failed with ``error``, which no call raised yet."""
        with _UNOBSERVED_LOCK:
            _UNOBSERVED[id(self)] = (self, step, error)

    def _observed(self) -> None:
        """A call raised this worker's failure: it no longer changes the exit status."""
        with _UNOBSERVED_LOCK:
            _UNOBSERVED.pop(id(self), None)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except BaseException as failed:
            exc.add_note(f"atomic_ckpt: {self._closing_what} failed as well: {failed!r}")


def _unobserved_failures_at_exit() -> None:
    """Exit with status 1 if a worker's background work failed and no call raised its error."""
    for worker in list(_LIVE):
        worker._join_at_exit()
    with _UNOBSERVED_LOCK:
        failed = list(_UNOBSERVED.values())
    if not failed:
        return
    for worker, step, error in failed:
        print(
            f"atomic_ckpt: {worker._failure_what} of step {step} failed and nothing waited "
            f"for it (call {type(worker).__name__}.close() before exiting): {error!r}",
            file=sys.stderr,
        )
    logging.shutdown()  # os._exit skips the atexit handlers registered before this one
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


atexit.register(_unobserved_failures_at_exit)
