"""Asynchronous commit: the training loop hands over a copy of its state and goes on.

A background thread runs the ordinary :meth:`CheckpointDir.commit` (write,
fsync, marker, promote, fsync the root), so a crash mid-way leaves what a
crash of a synchronous commit leaves: the previous checkpoints, untouched, and
a staging directory that ``clean()`` removes.

At most one commit is in flight: ``save`` first waits for the previous one
(back-pressure, so a slow disk slows the loop instead of piling up copies of
the state in memory). A failed background commit is never silent: its error is
raised by the next ``save``, by ``wait`` or by ``close``, whichever comes first
(and logged when it happens).

At interpreter exit a commit still in flight is finished (its thread is not a
daemon, and the commit needs no executor that shutdown would refuse). If it
failed and nothing raised its error, the process exits with status 1 instead
of 0, so a job script cannot mistake a lost checkpoint for success.
"""

from __future__ import annotations

import copy
import logging
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, SupportsIndex

from atomic_ckpt._core.l1_names.errors import CommitterClosedError
from atomic_ckpt._core.l3_formats.manifest import check_metadata
from atomic_ckpt._core.l4_protocol.retention import RetentionPolicy
from atomic_ckpt._core.l4_protocol.root import check_step
from atomic_ckpt._core.l5_facade.checkpoint import CheckpointDir
from atomic_ckpt._core.l5_facade.closing import ClosesOnExit

log = logging.getLogger(__name__)

ASYNC_STATE_FILE = "state.pt"
"""Where the default writer (``torch.save``) puts a state handed to :meth:`AsyncCommitter.save`."""

Writer = Callable[[Any, Path], None]
"""``writer(state, directory)``: write a (copied) state into the staging directory."""


def snapshot(state: Any) -> Any:
    """A copy of ``state`` that later training steps cannot change.

    torch tensors are detached and copied to CPU memory (a GPU tensor is not
    duplicated on the GPU). Storage is copied once per storage, and each tensor
    is rebuilt as the same view of the copy: tensors that share memory (tied
    weights, which ``state_dict()`` returns as separate tensor objects over one
    storage) stay shared, so the state is written once and the tie survives a
    load, as with ``torch.save`` of the original. Dicts, lists and tuples are
    rebuilt; anything else is ``copy.deepcopy``-ed. torch is never imported
    here: if the caller has not imported it, the state holds no tensors.
    """
    torch = sys.modules.get("torch")
    tensor_type = getattr(torch, "Tensor", None)
    storages: dict[tuple[str, int, int], Any] = {}
    memo: dict[int, Any] = {}  # the same tensor object twice: the same copy twice

    def tensor(original: Any) -> Any:
        if id(original) in memo:
            return memo[id(original)]
        t = original.detach()
        storage = t.untyped_storage()
        key = (str(storage.device), storage.data_ptr(), storage.nbytes())
        copied = storages.get(key)
        if copied is None:
            copied = storages[key] = (
                storage.cpu() if storage.device.type != "cpu" else storage.clone()
            )
        out = torch.empty(0, dtype=t.dtype)  # type: ignore[union-attr]
        memo[id(original)] = out.set_(copied, t.storage_offset(), t.size(), t.stride())
        return memo[id(original)]

    def walk(obj: Any) -> Any:
        if tensor_type is not None and isinstance(obj, tensor_type):
            return tensor(obj)
        if isinstance(obj, dict):
            out = {k: walk(v) for k, v in obj.items()}
            if type(obj) is dict:
                return out
            try:
                return type(obj)(out)  # OrderedDict and friends
            except TypeError:
                return out
        if isinstance(obj, list):
            return [walk(v) for v in obj]
        if isinstance(obj, tuple):
            items = [walk(v) for v in obj]
            return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
        return copy.deepcopy(obj)

    return walk(state)


def torch_save(state: Any, directory: Path) -> None:
    """The default writer: ``torch.save(state, directory / "state.pt")``."""
    import torch

    torch.save(state, directory / ASYNC_STATE_FILE)


class AsyncCommitter(ClosesOnExit):
    """Commit checkpoints of ``ckpts`` in a background thread, one at a time.

    ::

        with AsyncCommitter(ckpts) as saver:
            for step in range(steps):
                train_step()
                if step % 1000 == 0:
                    saver.save(step, {"model": model.state_dict(), "optim": opt.state_dict()})
        # leaving the block waits for the last commit and raises its error, if any

    ``writer(state, directory)`` writes a state (default: ``torch.save`` to
    ``state.pt``). ``retain`` is applied after each commit, in the background
    thread, once that commit is durable.
    """

    _closing_what = "the background commit"
    _failure_what = "the background commit"

    def __init__(
        self,
        ckpts: CheckpointDir,
        *,
        writer: Writer = torch_save,
        retain: RetentionPolicy | None = None,
    ) -> None:
        self._ckpts = ckpts
        self._writer = writer
        self._retain = retain
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        """Set when the thread in flight has finished its commit (its error recorded)."""
        self._step: int | None = None
        self._error: BaseException | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._watch()

    def __repr__(self) -> str:
        return f"AsyncCommitter({self._ckpts!r}, pending={self.pending})"

    @property
    def pending(self) -> int | None:
        """The step being committed in the background, or None."""
        thread = self._thread
        return self._step if thread is not None and not self._done.is_set() else None

    def save(
        self,
        step: SupportsIndex,
        state: Any,
        *,
        metadata: Mapping[str, Any] | None = None,
        replace_unusable: bool = False,
    ) -> None:
        """Start committing ``step`` in the background and return.

        ``state`` is either a save function ``fn(directory)``, run in the
        background thread as is (it must not read state that training goes on
        changing: bind a copy, e.g. ``functools.partial(write, snapshot(s))``),
        or a state that is copied here, in the caller's thread, with
        :func:`snapshot`, and written by the writer. Waits first for the
        previous commit, and raises its error if it failed (then nothing new
        is started). ``replace_unusable`` as for ``CheckpointDir.commit`` (the refusal
        is the background commit's error, raised by the next call).
        """
        step = check_step(step)
        meta = check_metadata(metadata)
        with self._lock:
            if self._closed:
                raise CommitterClosedError("this AsyncCommitter is closed; make a new one")
            self._join()
            if hasattr(state, "state_dict"):
                raise TypeError(
                    f"pass {type(state).__name__}.state_dict() (or a save function), "
                    "not the object itself"
                )
            if callable(state):
                job: Callable[[Path], None] = state
            else:
                copied = snapshot(state)
                writer = self._writer

                def job(directory: Path) -> None:
                    writer(copied, directory)

            self._step = step
            self._done = threading.Event()
            self._thread = threading.Thread(
                target=self._run,
                args=(step, job, meta, replace_unusable),
                name=f"atomic_ckpt-commit-{step}",
                # Not a daemon: at interpreter exit Python waits for the commit
                # to finish rather than killing it halfway.
                daemon=False,
            )
            self._thread.start()

    def wait(self) -> None:
        """Wait for the commit in flight, if any; raise its error if it failed."""
        with self._lock:
            self._join()

    def close(self) -> None:
        """Wait for the commit in flight and refuse new ones; raise its error if it failed."""
        with self._lock:
            self._closed = True
            self._join()

    def _join(self) -> None:
        """Join the thread in flight, then raise (once) the error of the last commit."""
        thread = self._thread
        if thread is not None:
            _wait_for(thread, self._done)
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            self._observed()
            raise error

    def _join_at_exit(self) -> None:
        thread = self._thread
        if thread is not None:
            _wait_for(thread, self._done)

    def _run(
        self,
        step: int,
        job: Callable[[Path], None],
        metadata: dict[str, Any],
        replace_unusable: bool = False,
    ) -> None:
        try:
            # A remote root has no unusable-step check (and no such option): pass it only if set.
            extra: dict[str, Any] = {"replace_unusable": True} if replace_unusable else {}
            with self._ckpts.begin(step, metadata=metadata, retain=self._retain, **extra) as commit:
                job(commit.path)
        except BaseException as exc:
            exc.add_note(f"atomic_ckpt: raised by the background commit of step {step}")
            log.error("background commit of step %d failed: %r", step, exc)
            self._error = exc
            self._failed(step, exc)
        finally:
            self._done.set()


def _wait_for(thread: threading.Thread, done: threading.Event) -> None:
    """Wait until ``thread`` has finished its commit (``done``), then join it.

    Not ``thread.join()`` alone: on CPython before 3.13 a KeyboardInterrupt (Ctrl-C)
    raised inside ``join()`` marks the still-running thread as stopped (bpo-45274's fix
    releases its state lock), so interpreter exit no longer waits for it and the commit
    in flight is cut off, its failure never reported. An interrupted ``Event.wait`` leaves
    the thread alone; by the time ``join()`` runs, the commit is over.
    """
    done.wait()
    thread.join()
