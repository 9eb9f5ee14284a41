"""Atomic, durable torch DCP saves: a ``StorageWriter`` that commits a whole checkpoint.

::

    import torch.distributed.checkpoint as dcp
    from atomic_ckpt import CheckpointDir
    from atomic_ckpt.dcp import AtomicWriter

    ckpts = CheckpointDir("/shared/run1")
    dcp.save(state, storage_writer=AtomicWriter(ckpts, step))            # on every rank
    future = dcp.async_save(state, storage_writer=AtomicWriter(ckpts, step))
    ...
    dcp.load(state, checkpoint_id=ckpts.latest().path)                   # plain DCP

A save, as DCP calls the writer (the coordinator is DCP's rank 0):

1. planning (``prepare_global_plan``, coordinator): begin the commit (the staging
   lock, then ``.tmp-N.<uuid>/``) and put the staging directory's name into every
   rank's plan;
2. ``write_data`` (every rank): write the shards there (``FileSystemWriter``'s own
   code, with its fsync switched off; the disk's writeback of each file is started
   every 32 MiB while it is written, so the fsync waits for the tail only), then
   fsync and hash exactly the files this rank created, once each;
3. still in ``write_data``: the ranks exchange their outcomes and file entries on
   atomic_ckpt's own gloo group, whose collectives time out after ``timeout``
   seconds. If a rank raised, died or hung, every surviving rank raises
   :class:`~atomic_ckpt.DistributedCommitError` and the coordinator removes the
   staging directory at once: nothing is promoted. (DCP's own collectives follow;
   a dead rank fails them at once, a hung one holds them for the timeout of DCP's
   process group);
4. ``finish`` (coordinator): ``.metadata`` is written, closed and only then
   fsynced (``FileSystemWriter`` fsyncs it before pickle's buffer is flushed); the
   ranks' entries are checked against one listing of the staging directory (names
   and sizes: no other rank's data is read) and published as the manifest: marker,
   rename (or an atomic exchange with an existing step), root fsync, ``retain``.

Each file is fsynced once, by the rank that wrote it: files + 4 fsyncs per save
(``.metadata``, the marker, the staging dir, the root), whatever the rank count.

Errors. DCP runs every writer call inside its own collectives and reports a
failure on any rank as ``torch.distributed.checkpoint.api.CheckpointException``
(a ``BaseException``) on every rank, with each failed rank's exception inside
(ours are :class:`~atomic_ckpt.DistributedCommitError`); when a rank died, DCP's
own next collective may raise torch's ``DistBackendError`` first (after the
staging directory is gone). :func:`save` and :func:`async_save` here call DCP
with an :class:`AtomicWriter` and turn all of that into one
:class:`~atomic_ckpt.DistributedCommitError` (the raising rank: its own error).

Async saves: ``dcp.async_save`` with the thread executor is supported (the
commit is promoted when the background write completes; the future raises if it
failed). A new writer for the same root waits for the previous async save of
this process (``on_pending="wait"``) or raises :class:`PendingSaveError` on every
rank (``"raise"``). The process executor is refused: see :class:`AtomicWriter`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import logging
import operator
import os
import threading
import time
import weakref
from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Literal, SupportsIndex, cast

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult

from . import (
    TMP_INFIX,
    Checkpoint,
    CheckpointDir,
    CheckpointError,
    CheckpointTimeoutError,
    Commit,
    CommitStateError,
    DistributedCommitError,
    FileEntry,
    RetentionPolicy,
    _fs,
)
from ._ranks import (
    _coordination_group,
    _describe,
    _failure_error,
    _failures,
    _Ranks,
    checked_listing,
)
from ._tree import run, sync_files
from .distributed import DEFAULT_TIMEOUT

# The private torch names used here, all in one place (checked: TESTED_TORCH):
# * the plan's storage data must be (a subclass of) FileSystemWriter's _StoragePrefix,
#   because its write_data reads ``.prefix``;
# * the staging copy helpers of BlockingAsyncStager, for cache_staged_state_dict=True
#   without its pinned memory (which needs an accelerator).
from torch.distributed._state_dict_utils import (  # isort: skip
    _copy_state_dict,
    _create_cpu_state_dict,
)
from torch.distributed.checkpoint.filesystem import _StoragePrefix  # isort: skip

__all__ = ["TESTED_TORCH", "AtomicWriter", "PendingSaveError", "async_save", "save"]

log = logging.getLogger(__name__)

TESTED_TORCH = ((2, 13), (2, 14))
"""The torch versions this writer is tested with: from the first, below the second."""

_version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
if not TESTED_TORCH[0] <= _version < TESTED_TORCH[1]:
    log.warning(
        "atomic_ckpt.dcp is tested with torch >=%s,<%s; this is torch %s",
        ".".join(map(str, TESTED_TORCH[0])),
        ".".join(map(str, TESTED_TORCH[1])),
        torch.__version__,
    )

_METADATA = ".metadata"
"""The file FileSystemWriter.finish writes (DCP's global metadata)."""


class PendingSaveError(CommitStateError):
    """A new DCP save was started while this process's previous async save of the same
    root is still running, and the writer was made with ``on_pending="raise"``."""


@dataclasses.dataclass
class _StagedPrefix(_StoragePrefix):
    """A rank's share of the global plan: its file prefix and the staging directory."""

    staging: str = ""


WRITEBACK_CHUNK = 32 << 20
"""Bytes a DCP file stream is written between two writeback starts (see _Writeback)."""


class _Writeback:
    """A DCP file stream that starts the kernel's writeback every ``WRITEBACK_CHUNK`` bytes.

    The disk then writes while DCP is still serializing, instead of only during the
    fsync that follows the file (what ``FileSystemWriter(sync_files=True)`` does):
    that fsync waits for the tail alone. Only a hint (``_fs.start_writeback``): the
    durability still comes from the fsync. DCP uses write, tell, flush and close.
    """

    def __init__(self, stream: io.IOBase) -> None:
        self._stream = stream
        self._fd = stream.fileno()
        self._end = self._started = stream.tell()

    def write(self, data: Any) -> int:
        written: int = self._stream.write(data)  # DCP only appends
        self._end += written
        if self._end - self._started >= WRITEBACK_CHUNK:
            self._stream.flush()  # what is still in Python's buffer is not dirty yet
            _fs.start_writeback(self._fd, self._started, self._end - self._started)
            self._started = self._end
        return written

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _CreatedFiles(FileSystem):
    """FileSystemWriter's filesystem, noting every file it creates (for this rank's fsyncs)
    and every error raised while one was written: FileSystemWriter's extra writer threads
    (``thread_count > 1``) drop their exceptions, so ``write_data`` must ask here.
    With ``writeback`` (a durable root), the files it writes start their writeback early.
    """

    def __init__(self, *, writeback: bool) -> None:
        super().__init__()
        self.created: set[str] = set()
        self.errors: list[BaseException] = []
        self.writeback = writeback
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
        writing = "w" in mode or "a" in mode or "x" in mode
        if writing:
            with self._lock:
                self.created.add(os.fspath(path))
        try:
            with super().create_stream(path, mode) as stream:
                if writing and self.writeback:
                    yield cast(io.IOBase, _Writeback(stream))  # a stand-in, see there
                else:
                    yield stream
        except BaseException as exc:
            with self._lock:
                self.errors.append(exc)
            raise


_LAST: weakref.WeakValueDictionary[Path, AtomicWriter] = weakref.WeakValueDictionary()
"""This process's latest async writer per root (see AtomicWriter._wait_for_previous)."""
_LAST_LOCK = threading.Lock()
_EXIT_GRACE = 1.0
"""Seconds ``on_pending="raise"`` allows a finished async save's thread to exit."""
_STAGED: dict[Path, Any] = {}
"""Per root, the CPU copy of the state that async saves with cache_staged_state_dict reuse."""


class AtomicWriter(FileSystemWriter):
    """A DCP ``StorageWriter`` that commits ``ckpts``'s ``step`` atomically and durably.

    Pass one to ``dcp.save`` or ``dcp.async_save`` on every rank (``storage_writer=``;
    no ``checkpoint_id``): ``root/<step>/`` then appears complete, with a manifest
    marker, or not at all; an existing step is replaced atomically. It loads with
    plain ``dcp.load(state, checkpoint_id=ckpts.latest().path)``.

    ``metadata`` (a JSON object) goes into the manifest; ``retain`` is applied by
    the coordinator once the checkpoint is durable. ``process_group`` must be the
    group given to DCP (default: all ranks); ``timeout`` bounds each wait for the
    other ranks (so it must exceed the spread between the fastest and the slowest
    rank's write). ``on_pending``: what a writer made while this process's previous
    async save of the same root is still running does, ``"wait"`` for it or
    ``"raise"`` :class:`PendingSaveError` (on every rank alike: the ranks agree).
    ``thread_count``, ``single_file_per_rank`` and ``per_thread_copy_ahead`` are
    ``FileSystemWriter``'s; ``cache_staged_state_dict`` too, but it keeps the CPU
    copy per root (across writers, one per save) and in plain CPU memory, so it works
    without an accelerator (see :meth:`stage`). Its ``sync_files`` is
    always off: the files are fsynced here, once each, as the root's
    :class:`~atomic_ckpt.SyncPolicy` says (``CheckpointDir(durable=False)``: none).

    Construct it on every rank: with torch.distributed initialized its first use
    creates atomic_ckpt's gloo groups (collective). Not supported:
    ``use_collectives=False`` (no coordinator, so nothing could commit) and
    ``AsyncCheckpointerType.PROCESS`` (the writer refuses to be pickled, so that
    future raises a ``TypeError`` saying so). That executor sends the writer to a
    daemon subprocess with a process group of its own; the writer holds this
    process's gloo groups (which cannot be pickled, and would have to be made
    again there, collectively, inside DCP's first save) and tells a later save
    when this one ended by the thread that runs it, which a subprocess does not
    have. Not impossible, but not done: use the thread executor.

    A save that fails before ``finish`` removes its staging directory on every
    path this writer sees (a rank's error or loss in ``write_data``, ``finish``);
    if DCP fails before ``write_data`` (say a rank dies during planning), call
    :meth:`abort` or let ``clean()`` remove it later.
    """

    def __init__(
        self,
        ckpts: CheckpointDir,
        step: SupportsIndex,
        *,
        metadata: Mapping[str, Any] | None = None,
        retain: RetentionPolicy | None = None,
        process_group: dist.ProcessGroup | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        on_pending: Literal["wait", "raise"] = "wait",
        thread_count: int = 1,
        single_file_per_rank: bool = True,
        per_thread_copy_ahead: int = 10_000_000,
        cache_staged_state_dict: bool = False,
    ) -> None:
        if not isinstance(ckpts, CheckpointDir):
            raise TypeError(f"ckpts must be a CheckpointDir, got {type(ckpts).__name__}")
        if on_pending not in ("wait", "raise"):
            raise ValueError(f"on_pending must be 'wait' or 'raise', got {on_pending!r}")
        step = operator.index(step)
        final = ckpts.path_of(step)  # validates the step
        super().__init__(
            final,
            single_file_per_rank=single_file_per_rank,
            sync_files=False,
            thread_count=thread_count,
            per_thread_copy_ahead=per_thread_copy_ahead,
            cache_staged_state_dict=False,  # ours: see stage()
            overwrite=True,
        )
        self._cache_staged = cache_staged_state_dict
        self._files = _CreatedFiles(writeback=ckpts.durable)
        self.fs = self._files
        self.ckpts = ckpts
        """The checkpoint root committed to."""
        self.step = step
        """The step committed."""
        self.metadata = dict(metadata) if metadata is not None else None
        self.retain = retain
        self.timeout = timeout
        self.on_pending = on_pending
        self.checkpoint: Checkpoint | None = None
        """The published checkpoint, on the coordinator, once the save succeeded."""
        self.wrote = False
        """Every rank wrote and flushed its files (the coordinator may publish)."""
        self.error: BaseException | None = None
        """Why this rank's part of the save failed, as this writer saw it (DCP may
        raise something else after it: its own collective errors)."""
        self._final = final
        self._group = process_group
        self._commit: Commit | None = None
        self._listings: list[list[FileEntry]] = []
        self._coordinator = False
        self._thread: threading.Thread | None = None
        self._async = False
        self._distributed = dist.is_available() and dist.is_initialized()
        self._work: _Ranks | None = None
        if self._distributed:
            # Two groups: the save's own (used by a background thread while an async
            # save runs) and one for deciding, in the caller's thread, about a pending one.
            self._work = _Ranks(_coordination_group(process_group, timeout, "dcp"), step, timeout)
            self._control = _Ranks(
                _coordination_group(process_group, timeout, "dcp-control"), step, timeout
            )
        self._wait_for_previous()

    def __repr__(self) -> str:
        return f"AtomicWriter({self.ckpts!r}, {self.step})"

    def __getstate__(self) -> dict[str, Any]:
        self._async = False  # it never runs here: nothing for a later save to wait for
        raise TypeError(
            "AtomicWriter cannot be pickled: AsyncCheckpointerType.PROCESS is not supported "
            "(see the AtomicWriter docstring); use the default thread executor"
        )

    # ------------------------------------------------------------------ pending saves

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
        if grace > 0:
            thread.join(grace)
        return thread.is_alive()

    def _wait(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        while self._pending() and time.monotonic() < end:
            thread = self._thread
            if thread is None:
                time.sleep(0.01)  # staged, not started yet
            else:
                thread.join(max(0.0, end - time.monotonic()))
        if self._pending():
            raise CheckpointTimeoutError(
                f"the previous async DCP save of step {self.step} into {self.ckpts.root} "
                f"did not end within {timeout:g}s (the new writer's timeout); wait for its "
                "future before starting another save",
                path=self.ckpts.root,
                step=self.step,
            )

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """``dcp.async_save`` copies the state to CPU memory through the writer (the time
        it blocks training); from here on, the save is pending.

        With ``cache_staged_state_dict`` the copy goes into the buffers of this root's
        previous async save (made once, reused while the state's structure is the same):
        no allocation and no page faults, a plain copy. Safe because a new writer of the
        root first waits for the previous save (``on_pending``), which reads them. The
        buffers stay allocated (one copy of the state per root) until the process ends.
        """
        # Again here: a writer made before the previous save was staged (both made up
        # front) saw nothing pending then, and must not copy into buffers still being read.
        self._wait_for_previous()
        self._async = True
        with _LAST_LOCK:
            _LAST[self.ckpts.root] = self
        try:
            return self._stage(state_dict)
        except BaseException:
            self._async = False  # it never starts: nothing for a later save to wait for
            raise

    def _stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        if not self._cache_staged:
            return super().stage(state_dict)
        self.per_thread_copy_ahead = 0  # as FileSystemWriter.stage: already in CPU memory
        cache = _STAGED.get(self.ckpts.root)
        if cache is not None and _same_layout(state_dict, cache):
            try:
                return _copy_staged(state_dict, cache)
            except Exception:  # torch's CompanionMismatch among others
                pass  # not copyable after all: make new buffers
        cache = _create_cpu_state_dict(state_dict)
        staged = _copy_staged(state_dict, cache)
        _STAGED[self.ckpts.root] = cache
        return staged

    # ------------------------------------------------------------------ DCP's calls

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        # DCP's first call in the thread that runs the save (async: torch's executor, whose
        # end a later save waits for), before anything here or in DCP can fail.
        self._thread = threading.current_thread()
        if checkpoint_id is not None and Path(checkpoint_id) != self._final:
            raise ValueError(
                f"AtomicWriter commits to {self._final}; do not pass checkpoint_id "
                f"({checkpoint_id!s}) to dcp.save with it"
            )
        super().reset(None)
        self.path = self._final

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        super().set_up_storage_writer(is_coordinator, *args, **kwargs)
        self._thread = threading.current_thread()
        self._coordinator = is_coordinator
        if not kwargs.get("use_collectives", True):
            raise ValueError(
                "AtomicWriter needs use_collectives=True: without a coordinator nothing "
                "can commit the checkpoint as a whole"
            )
        dcp_rank = kwargs.get("rank")
        if self._work is not None and dcp_rank is not None and dcp_rank != self._work.rank:
            raise ValueError(
                f"DCP runs this save as rank {dcp_rank}, but this process is rank "
                f"{self._work.rank} of the writer's group: pass the same process_group to "
                "AtomicWriter and to DCP, and do not pass no_dist=True on several ranks"
            )

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        # Unlike FileSystemWriter: nothing is created at the final path, and an existing
        # checkpoint there is replaced atomically at the end, not overwritten now.
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        # 1. The coordinator begins the commit and ships the staging name in each plan.
        commit = self.ckpts.begin(self.step, metadata=self.metadata, retain=self.retain)
        self._commit = commit
        return [
            dataclasses.replace(p, storage_data=_StagedPrefix(f"__{i}_", commit.path.name))
            for i, p in enumerate(plans)
        ]

    def write_data(
        self, plan: SavePlan, planner: SavePlanner
    ) -> torch.futures.Future[list[WriteResult]]:
        # 2. Write into the staging dir, then fsync and hash what this rank created.
        mine: BaseException | None = None
        results: list[WriteResult] = []
        entries: list[FileEntry] = []
        try:
            staging = self._staging_of(plan)
            self.path = staging
            self._files.created.clear()
            self._files.errors.clear()
            results = super().write_data(plan, planner).wait()
            self._check_written(plan, results, staging)
            names = [os.path.relpath(p, staging) for p in self._files.created]
            entries = sync_files(  # what this rank wrote: hashed through a mapping
                staging,
                names,
                policy=self.ckpts.sync,
                checksum=self.ckpts.checksum,
                workers=self.ckpts.workers,
                mapped=True,
            )
        except BaseException as exc:
            mine = exc
        # 3. Agree that every rank wrote and flushed (our own timed collective).
        try:
            gathered = self._gather((_describe(mine), entries))
            failed = _failures([g[0] for g in gathered])
            if mine is not None:
                others = [(r, w) for r, w in failed if r != self._rank()]
                if others:
                    mine.add_note(
                        "atomic_ckpt: other ranks failed too: "
                        + "; ".join(f"rank {r}: {w}" for r, w in others)
                    )
                raise mine
            if failed:
                raise _failure_error(self.step, failed, "while writing")
        except BaseException as exc:
            self.error = exc
            self._abort(exc)
            raise
        self._listings = [g[1] for g in gathered]
        self.wrote = True
        done: torch.futures.Future[list[WriteResult]] = torch.futures.Future()
        done.set_result(results)
        return done

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        # 4. The coordinator: .metadata, durable; one manifest from every rank's entries.
        commit = self._commit
        if commit is None:
            raise CommitStateError("finish() before prepare_global_plan()", step=self.step)
        try:
            super().finish(metadata, results)
            own = self.ckpts.sync_files(commit.path, [_METADATA])
            files = self._merge(commit.path, [*self._listings, own])
            self.checkpoint = commit.publish(files=files)
        except BaseException as exc:
            self.error = exc
            commit.abort(exc)
            raise

    def storage_meta(self) -> StorageMeta | None:
        # The checkpoint's id is where it ends up, not the staging dir it is written in.
        return StorageMeta(checkpoint_id=self._final, save_id=self.save_id)

    def abort(self) -> None:
        """Remove the staging directory of a save that failed (a no-op after success,
        on a rank other than the coordinator, or if it was already removed)."""
        if self._commit is not None:
            self._commit.abort()

    # ------------------------------------------------------------------ internals

    def _rank(self) -> int:
        return self._work.rank if self._work is not None else 0

    def _gather(self, obj: tuple[str | None, list[FileEntry]]) -> list[Any]:
        if self._work is None:
            return [obj]
        return self._work.all_gather(obj, "agreeing that every rank wrote its DCP files")

    def _abort(self, exc: BaseException) -> None:
        if self._commit is not None:
            self._commit.abort(exc)

    def _staging_of(self, plan: SavePlan) -> Path:
        data = plan.storage_data
        name = getattr(data, "staging", "")
        if not isinstance(data, _StagedPrefix) or not name or Path(name).name != name:
            raise DistributedCommitError(
                "the plan from DCP's coordinator carries no atomic_ckpt staging directory: "
                "use an AtomicWriter on every rank (and a planner that keeps storage_data)",
                step=self.step,
            )
        if TMP_INFIX not in name:
            raise DistributedCommitError(f"{name!r} is not a staging directory", step=self.step)
        return self.ckpts.root / name

    def _check_written(self, plan: SavePlan, results: list[WriteResult], staging: Path) -> None:
        """Every item of ``plan`` was written: FileSystemWriter's extra threads drop their
        errors (torch 2.13), which would leave items out of ``.metadata``, unloadable."""
        if self._files.errors:
            raise self._files.errors[0]
        missing = {i.index for i in plan.items} - {r.index for r in results}
        if missing:
            raise CheckpointError(
                f"DCP's writer returned no result for {len(missing)} of the {len(plan.items)} "
                f"items of this rank (e.g. {sorted(map(str, missing))[0]}): one of its writer "
                "threads failed. Nothing was promoted",
                path=staging,
                step=self.step,
            )

    def _merge(self, staging: Path, listings: list[list[FileEntry]]) -> list[FileEntry]:
        """Every rank's entries as one manifest, checked against one listing of the
        staging dir (names and sizes; no data read); anything no rank created (a
        planner's extra file) is fsynced and hashed here, with a warning."""
        declared: dict[str, FileEntry] = {}
        for entries in listings:
            for e in entries:
                declared.setdefault(e.path, e)
        listing = checked_listing(
            self.ckpts, staging, declared, viewer="the coordinator", step=self.step
        )
        extra = [e.path for e in listing if e.path not in declared]
        if extra:
            log.warning(
                "%d entries in %s were not created by DCP's writer (%s...); fsyncing them "
                "on the coordinator",
                len(extra),
                staging,
                extra[0],
            )
            for e in self.ckpts.sync_files(staging, extra):
                declared[e.path] = e
        return sorted(declared.values(), key=lambda e: e.path)


COPY_THREADS = 4
"""Threads that copy the state into cached staging buffers (at most one per core)."""


def _copy_staged(state: dict[str, Any], cache: dict[str, Any]) -> dict[str, Any]:
    """torch's ``_copy_state_dict(state, cache)``, its tensors copied on several threads.

    The result has ``state``'s structure (dicts, lists, tuples), ``cache``'s tensors
    (each filled from ``state``'s) and ``state``'s other values. The caller's training
    loop is blocked for the copy, so it uses the cores that wait with it: on 2 cores,
    ~800 MB in 0.04 s instead of 0.07 s. Every leaf goes through torch's own helper
    (which knows DTensors, and refuses the values DCP cannot save), tensors largest
    first; tensors on an accelerator are copied in the calling thread (its stream).
    """
    pairs: list[tuple[Any, Any]] = []

    def collect(s: Any, c: Any) -> None:
        if isinstance(s, dict):
            for key, value in s.items():
                collect(value, c[key])
        elif isinstance(s, list | tuple):
            for a, b in zip(s, c, strict=True):
                collect(a, b)
        else:
            pairs.append((s, c))

    collect(state, cache)
    copied: list[Any] = [None] * len(pairs)

    def copy(i: int) -> None:
        copied[i] = _copy_state_dict({"t": pairs[i][0]}, {"t": pairs[i][1]})["t"]

    tensors = sorted(
        (i for i, (s, _) in enumerate(pairs) if isinstance(s, torch.Tensor)),
        key=lambda i: -pairs[i][0].numel() * pairs[i][0].element_size(),
    )
    for i in range(len(pairs)):
        if not isinstance(pairs[i][0], torch.Tensor):
            copy(i)  # torch's checks: a type DCP cannot save raises, as it always did
    # Only CPU to CPU copies are spread: a device's copy must stay on the caller's stream.
    on_cpu = all(pairs[i][0].device.type == "cpu" for i in tensors)
    threads = min(COPY_THREADS, os.cpu_count() or 1, len(tensors)) if on_cpu else 1
    run([functools.partial(copy, i) for i in tensors], max(threads, 1))
    leaves = iter(copied)

    def build(s: Any) -> Any:
        if isinstance(s, dict):
            return {key: build(value) for key, value in s.items()}
        if isinstance(s, list):
            return [build(v) for v in s]
        if isinstance(s, tuple):
            return tuple(build(v) for v in s)
        return next(leaves)

    staged: dict[str, Any] = build(state)
    return staged


def _same_layout(state: Any, cache: Any) -> bool:
    """``cache`` has ``state``'s keys, and each of its tensors the same shape and dtype.

    Checked before reusing the buffers: ``copy_`` would broadcast a smaller tensor into a
    larger buffer and cast another dtype to the buffer's, saving something else than the
    state, without an error.
    """
    if isinstance(state, torch.Tensor):
        return (
            isinstance(cache, torch.Tensor)
            and state.shape == cache.shape
            and state.dtype == cache.dtype
        )
    if isinstance(state, Mapping):
        return (
            isinstance(cache, Mapping)
            and state.keys() == cache.keys()
            and all(_same_layout(v, cache[k]) for k, v in state.items())
        )
    if isinstance(state, list | tuple):
        return (
            isinstance(cache, list | tuple)
            and len(state) == len(cache)
            and all(map(_same_layout, state, cache))
        )
    return not isinstance(cache, torch.Tensor)


def _translate(exc: BaseException, writer: AtomicWriter) -> BaseException:
    """The one error :func:`save` raises on this rank for DCP's ``exc``."""
    rank = writer._rank()
    if isinstance(exc, CheckpointException):
        failures = exc.failures
        if rank in failures:
            own = failures[rank]
            own_exc = own[0] if isinstance(own, tuple) else own
            if isinstance(own_exc, BaseException):
                return own_exc
        detail = "; ".join(
            f"rank {r}: {_describe(f[0] if isinstance(f, tuple) else f)}"
            for r, f in sorted(failures.items())
        )
        return DistributedCommitError(
            f"the DCP save of step {writer.step} failed on rank(s) "
            f"{', '.join(map(str, sorted(failures)))} ({detail}). Nothing was promoted",
            step=writer.step,
            ranks=tuple(sorted(failures)),
        )
    if isinstance(exc, CheckpointError):
        return exc
    if writer.error is not None:
        if isinstance(writer.error, DistributedCommitError):
            writer.error.add_note(f"atomic_ckpt: then DCP's own collective failed: {exc!r}")
        return writer.error
    if writer.wrote:
        outcome = (
            f"after every rank had written and flushed its files: the coordinator may have "
            f"promoted step {writer.step} before contact was lost, or not; resume() after "
            "the restart shows what is complete"
        )
    else:
        outcome = (
            f"before every rank had written: step {writer.step} was not promoted; clean() "
            "removes a staging dir that a crashed coordinator left"
        )
    return DistributedCommitError(
        f"the DCP save of step {writer.step} failed on rank {rank}: it lost contact with "
        f"the other ranks ({_describe(exc)}) {outcome}",
        step=writer.step,
    )


def save(
    state_dict: dict[str, Any],
    ckpts: CheckpointDir,
    step: SupportsIndex,
    *,
    planner: SavePlanner | None = None,
    **options: Any,
) -> Path:
    """``dcp.save(state_dict, storage_writer=AtomicWriter(ckpts, step, **options))``
    on every rank, with any failure raised as one
    :class:`~atomic_ckpt.DistributedCommitError` (the failing rank: its own error).

    Returns the committed checkpoint's directory, on every rank. ``options`` are
    :class:`AtomicWriter`'s, ``process_group`` included.
    """
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    writer = AtomicWriter(ckpts, step, **options)
    try:
        dcp_save(state_dict, storage_writer=writer, planner=planner, process_group=writer._group)
    except BaseException as exc:
        writer._abort(exc)
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        raise _translate(exc, writer) from exc
    return writer._final


def async_save(
    state_dict: dict[str, Any],
    ckpts: CheckpointDir,
    step: SupportsIndex,
    *,
    planner: SavePlanner | None = None,
    **options: Any,
) -> Future[None]:
    """``dcp.async_save(state_dict, storage_writer=AtomicWriter(ckpts, step, **options))``
    on every rank (thread executor); the returned future's error, if the commit
    failed, is one :class:`~atomic_ckpt.DistributedCommitError` (the failing rank:
    its own error). Returns once the state is staged (copied to CPU memory)."""
    from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save

    writer = AtomicWriter(ckpts, step, **options)
    inner = dcp_async_save(
        state_dict, storage_writer=writer, planner=planner, process_group=writer._group
    )
    if not isinstance(inner, Future):  # an AsyncSaveResponse (a stager of its own)
        inner = inner.upload_completion
    outer: Future[None] = Future()

    def relay(done: Future[Any]) -> None:
        exc = done.exception()
        if exc is not None:
            writer._abort(exc)
        if exc is None:
            outer.set_result(None)
        else:
            translated = _translate(exc, writer)
            if translated is not exc:
                translated.__cause__ = exc
            outer.set_exception(translated)

    inner.add_done_callback(relay)
    return outer
