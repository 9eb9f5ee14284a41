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
   lock, then ``N.tmp-<uuid>/``) and put the staging directory's name into every
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

import logging
from concurrent.futures import Future
from pathlib import Path
from typing import Any, SupportsIndex

import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.planner import SavePlanner

from atomic_ckpt import CheckpointDir, CheckpointError, DistributedCommitError
from atomic_ckpt._core.l1_names import public as _public
from atomic_ckpt.distributed._ranks import _describe

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

# The writer's modules, imported only now that torch's version is checked: they subclass
# DCP's classes and use private torch names, all tested with TESTED_TORCH (each explained
# where it is imported): _StoragePrefix in _dcp_writer; _copy_state_dict and
# _create_cpu_state_dict in _dcp_copy.
# WRITEBACK_CHUNK and COPY_THREADS stay importable from here (outside __all__), but are
# read in the module that defines them (_dcp_files, _dcp_copy): change them there.
from atomic_ckpt.dcp._copy import COPY_THREADS as COPY_THREADS  # noqa: E402
from atomic_ckpt.dcp._files import WRITEBACK_CHUNK as WRITEBACK_CHUNK  # noqa: E402
from atomic_ckpt.dcp._pending import PendingSaveError  # noqa: E402
from atomic_ckpt.dcp._writer import AtomicWriter  # noqa: E402


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
    its own error), also logged (``atomic_ckpt.dcp``, ERROR) when it happens, for a
    script that never reads the future. Returns once the state is staged (copied to CPU
    memory)."""
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
            # Said now, not only through the future: a script that never reads it would
            # otherwise end without a word about the checkpoint it does not have.
            log.error(
                "the asynchronous save of step %s to %s failed, so it was not committed "
                "(the checkpoints committed before are intact): %s",
                writer.step,
                writer.ckpts.root,
                translated,
            )
            outer.set_exception(translated)

    inner.add_done_callback(relay)
    return outer


_public.export(__name__, globals(), __all__)
