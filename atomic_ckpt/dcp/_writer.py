"""The DCP ``StorageWriter`` itself: :class:`AtomicWriter`, which runs a commit of
:mod:`atomic_ckpt` inside DCP's save (the steps that :mod:`atomic_ckpt.dcp` describes:
planning, ``write_data``, the ranks' agreement, ``finish``).

(Private: re-exported by :mod:`atomic_ckpt.dcp`, which imports it after its torch
version check.)
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, SupportsIndex

import torch
import torch.distributed as dist
from torch.distributed.checkpoint._extension import StreamTransformExtension
from torch.distributed.checkpoint.filesystem import FileSystemWriter, SerializationFormat
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult

from atomic_ckpt import (
    TMP_INFIX,
    Checkpoint,
    CheckpointDir,
    CheckpointError,
    Commit,
    CommitStateError,
    DistributedCommitError,
    FileEntry,
    RetentionPolicy,
)
from atomic_ckpt._core.l3_formats.tree import sync_files
from atomic_ckpt._core.l4_protocol import carry as _carry
from atomic_ckpt._core.l4_protocol.root import check_step
from atomic_ckpt.dcp._copy import _stage_cached
from atomic_ckpt.dcp._files import _CreatedFiles
from atomic_ckpt.dcp._pending import _PendingSaves
from atomic_ckpt.distributed import DEFAULT_TIMEOUT
from atomic_ckpt.distributed._ranks import (
    _coordination_group,
    _describe,
    _failures,
    _Ranks,
    checked_listing,
    raise_failures,
)

# A private torch name (checked: atomic_ckpt.dcp.TESTED_TORCH): the plan's storage data
# must be (a subclass of) FileSystemWriter's _StoragePrefix, because its write_data reads
# ``.prefix``.
from torch.distributed.checkpoint.filesystem import _StoragePrefix  # isort: skip

log = logging.getLogger("atomic_ckpt.dcp")  # the public module's, as before the split

_METADATA = ".metadata"
"""The file FileSystemWriter.finish writes (DCP's global metadata)."""


@dataclasses.dataclass
class _StagedPrefix(_StoragePrefix):
    """A rank's share of the global plan: its file prefix and the staging directory."""

    staging: str = ""


class AtomicWriter(_PendingSaves, FileSystemWriter):
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
    ``thread_count``, ``single_file_per_rank``, ``per_thread_copy_ahead``,
    ``serialization_format`` and ``_extensions`` (stream transforms such as torch's
    ``ZStandard`` compression, which needs the ``zstandard`` package; the manifest's
    sizes and checksums are then those of the transformed files, as on disk) are
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
        _extensions: Sequence[StreamTransformExtension] | None = None,
        serialization_format: SerializationFormat = SerializationFormat.TORCH_SAVE,
        replace_unusable: bool = False,
    ) -> None:
        if not isinstance(ckpts, CheckpointDir):
            raise TypeError(f"ckpts must be a CheckpointDir, got {type(ckpts).__name__}")
        if on_pending not in ("wait", "raise"):
            raise ValueError(f"on_pending must be 'wait' or 'raise', got {on_pending!r}")
        step = check_step(step)  # a bool is no step, as for ckpts.commit
        final = ckpts.path_of(step)
        super().__init__(
            final,
            single_file_per_rank=single_file_per_rank,
            sync_files=False,
            thread_count=thread_count,
            per_thread_copy_ahead=per_thread_copy_ahead,
            cache_staged_state_dict=False,  # ours: see stage()
            overwrite=True,
            _extensions=_extensions,
            serialization_format=serialization_format,
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
        self.replace_unusable = replace_unusable
        """As for ``CheckpointDir.commit``: replace a checkpoint a newer atomic_ckpt wrote,
        or one moved to this step's name by hand, knowingly (else: StepConflictError)."""
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

    # ------------------------------------------------------------------ staging

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """``dcp.async_save`` copies the state to CPU memory through the writer (the time
        it blocks training); from here on, the save is pending.

        With ``cache_staged_state_dict`` the copy goes into the buffers of this root's
        previous async save (made once, reused while the state's structure is the same):
        no allocation and no page faults, a plain copy. Safe because a new writer of the
        root first waits for the previous save (``on_pending``), which reads them. The
        buffers stay allocated (one copy of the state per root) until the process ends.
        """
        self._begin_async()  # waits for the previous save again: see there
        try:
            return self._stage(state_dict)
        except BaseException:
            self._async = False  # it never starts: nothing for a later save to wait for
            raise

    def _stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        if not self._cache_staged:
            return super().stage(state_dict)
        self.per_thread_copy_ahead = 0  # as FileSystemWriter.stage: already in CPU memory
        return _stage_cached(self.ckpts.root, state_dict)

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
        commit = self.ckpts.begin(
            self.step,
            metadata=self.metadata,
            retain=self.retain,
            replace_unusable=self.replace_unusable,
        )
        commit._pending = _carry.Listed("a DCP save (its writer lists its files)")
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
            raise_failures(mine, failed, rank=self._rank(), step=self.step, phase="while writing")
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
