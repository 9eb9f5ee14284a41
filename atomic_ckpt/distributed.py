"""Multi-rank commit and resume over ``torch.distributed`` (PROTOCOL.md, "Several ranks").

::

    from atomic_ckpt import CheckpointDir
    from atomic_ckpt.distributed import distributed_commit, rank_path, resume

    ckpts = CheckpointDir("/shared/run1")
    with distributed_commit(ckpts, step) as path:     # on every rank
        torch.save(shard, rank_path(path / "model.pt"))  # model.rank<r>.pt, declared
        if rank == 0:
            save_config(path / "config.json")
            declare(path / "config.json")              # flushed by rank 0 alone
    ckpt = resume(ckpts)                               # the same on every rank

A commit, on every rank of the group, in order:

1. rank 0 takes its staging lock, creates ``.tmp-N.<uuid>/`` and broadcasts the
   name (or why it could not);
2. every rank writes its files into it (the ``with`` body);
3. the ranks exchange their outcomes (this is the barrier after the writes);
   if any rank raised, every rank raises and rank 0 removes the staging dir;
4. every rank fsyncs and hashes the files it *declared*: those it named with
   :func:`rank_path` (its own rank's names) or passed to :func:`declare` (a
   declared directory stands for its whole subtree), so each file is flushed
   once, by the rank that wrote it and whose page cache holds it; the ranks
   exchange these entries and outcomes;
5. the fallback sweep, for what no rank declared: every rank lists the staging
   tree (a listing and a stat per entry, no data read) and checks that every
   declared file is there with the size its writer recorded; an undeclared file
   is fsynced by rank 0 and by every rank that did not call :func:`declare` (it
   may have written it: on a network filesystem only the writer's fsync flushes
   it; a rank that calls :func:`declare` vouches for declaring all it wrote), the
   undeclared files are split among the ranks for hashing, and rank 0 fsyncs the
   subdirectories; the ranks exchange their listings, hashes and outcomes, and a
   listing that differs from rank 0's is an error (the shared filesystem does not
   show every rank the same directory). When every file is declared, a commit
   makes one fsync per file, one per directory and a constant few, whatever the
   number of ranks;
6. rank 0 alone writes the marker (a manifest of every rank's files), fsyncs
   the staging dir, promotes under the root lock, fsyncs the root and, with
   ``retain=``, applies the retention policy;
7. rank 0 broadcasts the outcome: no rank leaves the ``with`` block before the
   checkpoint is durable (this broadcast is the closing barrier), and if rank 0
   failed every rank raises.

The collectives run on a gloo group of the same ranks made for this purpose
with ``timeout``: a rank that crashes or hangs makes the others raise
:class:`~atomic_ckpt.DistributedCommitError` (a lost connection is usually
noticed at once, a hung rank after ``timeout`` seconds) instead of waiting
forever. Rank 0 promotes only after every rank reported success, so a rank
lost before that means nothing was promoted; ``clean()`` removes a staging
directory that a crashed rank 0 left behind.

With its helper ``_ranks`` (the collectives), this is the only part of ``atomic_ckpt``
that imports torch.distributed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import operator
import os
import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, SupportsIndex

import torch.distributed as dist

from . import (
    Checkpoint,
    CheckpointDir,
    CheckpointError,
    Commit,
    CommitStateError,
    DistributedCommitError,
    FileEntry,
    RetentionPolicy,
)
from ._ranks import (
    _all_entered,
    _coordination_group,
    _describe,
    _failure_error,
    _failures,
    _Ranks,
    checked_listing,
)

__all__ = [
    "DEFAULT_ENTRY_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "declare",
    "distributed_commit",
    "load_dcp",
    "rank_path",
    "resume",
]

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 1800.0
"""Seconds a rank waits for the others at each step of a commit (as torch's default)."""
DEFAULT_ENTRY_TIMEOUT = 300.0
"""Seconds every rank waits for all to enter a commit before it names the missing ones."""


@contextlib.contextmanager
def distributed_commit(
    ckpts: CheckpointDir,
    step: SupportsIndex,
    *,
    metadata: Mapping[str, Any] | None = None,
    group: dist.ProcessGroup | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    retain: RetentionPolicy | None = None,
    entry_timeout: float = DEFAULT_ENTRY_TIMEOUT,
) -> Iterator[Path]:
    """Commit one checkpoint written by every rank of ``group`` (default: all ranks).

    Enter it on every rank with the same ``step``; each yields the same staging
    directory. On a normal exit of every rank the checkpoint is durable and
    promoted when the ``with`` block ends, on every rank. If any rank raises,
    every rank raises (the raising rank its own exception, the others a
    :class:`~atomic_ckpt.DistributedCommitError` naming the rank and its
    error) and nothing is promoted. ``metadata`` is rank 0's. ``timeout``
    bounds each wait for the other ranks, so it must exceed the difference
    between the slowest and the fastest rank's save. ``retain`` is applied by
    rank 0 after the commit is durable (only rank 0 deletes).

    It is collective: called on some ranks only (say inside ``if rank == 0:``,
    followed by a barrier) it cannot complete, so every rank first checks that
    all entered, and raises :class:`~atomic_ckpt.DistributedCommitError` naming
    the missing ranks after ``entry_timeout`` seconds instead of hanging.
    """
    step = operator.index(step)
    _all_entered(group, "distributed_commit", entry_timeout, step)
    ranks = _Ranks(_coordination_group(group, timeout), step, timeout)
    # 1. Rank 0 creates the staging dir (its lock first) and broadcasts its name.
    commit: Commit | None = None
    problem: BaseException | None = None
    if ranks.rank == 0:
        try:
            commit = ckpts.begin(step, metadata=metadata, retain=retain)
        except Exception as exc:
            problem = exc
    try:
        name, why = ranks.broadcast(
            (commit.path.name if commit else None, _describe(problem)),
            "receiving the staging directory from rank 0",
        )
    except BaseException as exc:
        if commit is not None:
            commit.abort(exc)
        raise
    if problem is not None:
        raise problem
    if why is not None or name is None:
        raise DistributedCommitError(
            f"rank 0 could not start the commit of step {step}: {why}", step=step, ranks=(0,)
        )
    staging = ckpts.root / name
    declared_here = _Declared.open(staging)
    try:
        # 2. Every rank writes its files (and declares them, with rank_path or declare).
        mine: BaseException | None = None
        try:
            yield staging
        except BaseException as exc:
            mine = exc
        finally:
            _Declared.close(staging)
        # 3. Agree that every rank wrote (the barrier after the writes).
        failed = _failures(ranks.all_gather(_describe(mine), "agreeing that every rank wrote"))
        if mine is not None:
            others = [(r, w) for r, w in failed if r != ranks.rank]
            if others:
                mine.add_note(
                    "atomic_ckpt: other ranks failed too: "
                    + "; ".join(f"rank {r}: {w}" for r, w in others)
                )
            raise mine
        if failed:
            raise _failure_error(step, failed, "while writing")
        # 4. Every rank fsyncs and hashes what it declared: each file once, by its writer.
        synced: list[FileEntry] | None = None
        try:
            synced = ckpts.sync_files(staging, _expand(ckpts, staging, declared_here.names))
        except Exception as exc:
            mine = exc
        gathered = ranks.all_gather(
            (_describe(mine), synced or []), "agreeing that every rank flushed its files"
        )
        if mine is not None:
            raise mine
        failed = _failures([g[0] for g in gathered])
        if failed:
            raise _failure_error(step, failed, "while flushing")
        declared: dict[str, FileEntry] = {}
        for _, entries in gathered:
            for e in entries:
                declared.setdefault(e.path, e)
        # 5. The fallback sweep of what no rank declared; rank 0 fsyncs the directories.
        swept: tuple[str, list[FileEntry], dict[str, str]] | None = None
        try:
            swept = _sweep(
                ckpts,
                staging,
                declared,
                rank=ranks.rank,
                size=ranks.size,
                declared_all=declared_here.explicit,
            )
        except Exception as exc:
            mine = exc
        gathered_sweep = ranks.all_gather(
            (_describe(mine), swept[0] if swept else None, swept[2] if swept else {}),
            "agreeing that every rank flushed the undeclared files",
        )
        if mine is not None:
            raise mine
        failed = _failures([g[0] for g in gathered_sweep])
        if failed:
            raise _failure_error(step, failed, "while flushing")
        digests = [g[1] for g in gathered_sweep]
        differ = [r for r, d in enumerate(digests) if d != digests[0]]
        if differ:
            raise DistributedCommitError(
                f"the commit of step {step} failed: rank(s) {differ} see different files in "
                f"{staging} than rank 0 after the barrier. The filesystem must show every "
                "rank the same directory listing once all have written (on NFS, mount "
                "with lookupcache=positive or actimeo=0). Nothing was promoted",
                step=step,
                ranks=tuple(differ),
            )
    except BaseException as exc:
        if commit is not None:
            commit.abort(exc)
        raise
    # 6. Rank 0: the marker (listing every rank's files), promote, fsync the root,
    #    then the retention policy.
    outcome: BaseException | None = None
    if commit is not None and swept is not None:
        sums: dict[str, str] = {}
        for _, _, share in gathered_sweep:
            sums.update(share)
        files = [declared.get(e.path) or _with_checksum(e, sums) for e in swept[1]]
        try:
            commit.publish(files=files)
        except Exception as exc:
            outcome = exc
    # 7. Rank 0 tells every rank the outcome: the barrier after the promotion.
    why = ranks.broadcast(
        _describe(outcome), "waiting for rank 0 to promote the checkpoint", last=True
    )
    if outcome is not None:
        raise outcome
    if why is not None:
        raise DistributedCommitError(
            f"rank 0 failed to commit step {step}: {why}", step=step, ranks=(0,)
        )


def _expand(ckpts: CheckpointDir, staging: Path, declared: set[str]) -> list[str]:
    """The declared paths that exist, a declared directory with everything below it."""
    out: list[str] = []
    for rel in sorted(declared):
        path = staging / rel
        if not os.path.lexists(path):
            continue  # named with rank_path but never written: nothing to flush
        out.append(rel)
        if path.is_dir() and not path.is_symlink():
            out += [f"{rel}/{e.path}" for e in ckpts.list_tree(path)]
    return out


def _sweep(
    ckpts: CheckpointDir,
    staging: Path,
    declared: dict[str, FileEntry],
    *,
    rank: int,
    size: int,
    declared_all: bool,
) -> tuple[str, list[FileEntry], dict[str, str]]:
    """Step 5 on one rank: list the tree, check the declared files against it, fsync the
    undeclared files (rank 0, and a rank that did not call declare()) and, on rank 0, the
    undeclared directories; hash this rank's share of the undeclared files.

    Returns a digest of the listing (to compare across ranks), the listing, and the
    checksums of this rank's share.
    """
    listing = checked_listing(ckpts, staging, declared, viewer=f"rank {rank}")
    undeclared = [e.path for e in listing if e.type == "file" and e.path not in declared]
    flush = list(undeclared) if rank == 0 or not declared_all else []
    if rank == 0:
        flush += [e.path for e in listing if e.type == "dir" and e.path not in declared]
    if flush:
        ckpts.sync_files(staging, flush, hash=False)
    share = undeclared[rank::size]
    sums: dict[str, str] = {}
    if ckpts.checksum is not None and share:
        with ThreadPoolExecutor(max_workers=min(8, len(share))) as pool:
            hashes = pool.map(lambda rel: ckpts.checksum_file(staging / rel) or "", share)
            sums = dict(zip(share, hashes, strict=True))
    body = json.dumps([e.to_json() for e in listing]).encode()
    return hashlib.sha256(body).hexdigest(), listing, sums


def _with_checksum(entry: FileEntry, sums: dict[str, str]) -> FileEntry:
    if entry.type != "file" or entry.path not in sums:
        return entry
    return FileEntry(entry.path, "file", size=entry.size, checksum=sums[entry.path])


def resume(
    ckpts: CheckpointDir,
    *,
    group: dist.ProcessGroup | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    verify: bool = False,
    fresh: bool = False,
) -> Checkpoint | None:
    """The checkpoint to resume from, chosen by rank 0 and the same on every rank.

    Rank 0 applies ``CheckpointDir.resume_point(verify=..., fresh=...)``: a root of
    unmarked step directories and no complete checkpoint raises
    :class:`~atomic_ckpt.UnmarkedCheckpointsError` on every rank unless ``fresh``.

    Rank 0 scans the root (with ``verify=True``, the newest checkpoint whose
    files match its manifest) and broadcasts its choice; the other ranks never
    scan, so they cannot disagree. None on every rank if there is none.
    """
    ranks = _Ranks(_coordination_group(group, timeout), None, timeout)
    choice: Checkpoint | None = None
    problem: BaseException | None = None
    if ranks.rank == 0:
        try:
            choice = ckpts.resume_point(verify=verify, fresh=fresh)
        except Exception as exc:
            problem = exc
    # Rank 0's own error (ours pickle with their attributes) is raised on every rank.
    shared = problem if isinstance(problem, CheckpointError) else None
    choice, why, shared = ranks.broadcast(
        (choice, _describe(problem), shared), "receiving rank 0's resume step"
    )
    if problem is not None:
        raise problem
    if shared is not None:
        raise shared
    if why is not None:
        raise DistributedCommitError(
            f"rank 0 could not choose a checkpoint to resume from: {why}", ranks=(0,)
        )
    return choice


def rank_path(
    path: str | os.PathLike[str], rank: int | None = None, *, group: dist.ProcessGroup | None = None
) -> Path:
    """``dir/model.pt`` -> ``dir/model.rank<r>.pt``: the one-file-per-rank layout.

    ``rank`` defaults to this process's rank in ``group``. This rank's own name,
    made inside a :func:`distributed_commit`, is also declared (as by
    :func:`declare`): this rank alone fsyncs and hashes that file.
    """
    if rank is None:
        rank = dist.get_rank(group)
        mine = True
    else:
        mine = dist.is_available() and dist.is_initialized() and rank == dist.get_rank(group)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank must be a non-negative int, got {rank!r}")
    p = Path(path)
    named = p.with_name(f"{p.stem}.rank{rank}{p.suffix}")
    if mine:
        _Declared.add(named, strict=False)
    return named


def declare(*paths: str | os.PathLike[str]) -> None:
    """Say that this rank wrote ``paths`` in the staging directory of the current
    :func:`distributed_commit`, so that it alone fsyncs and hashes them (a directory:
    everything below it too).

    Each file is then flushed once, by its writer, instead of by the fallback sweep
    (see the module's notes). Names made with :func:`rank_path` for this rank are
    declared already. Callable from any thread of the rank, before or after the file
    is written, while the ``with`` block runs; outside one it raises
    :class:`~atomic_ckpt.CommitStateError`.
    """
    for path in paths:
        _Declared.add(Path(path), strict=True)


class _Declared:
    """The paths each open staging directory's rank declared (this process's commits).

    ``explicit``: :func:`declare` was called, so the rank vouches for having declared
    everything it wrote; names from :func:`rank_path` alone do not (existing code may
    write other files beside them, which the rank must still flush itself).
    """

    _lock = threading.Lock()
    _open: dict[Path, _Declared] = {}  # noqa: RUF012 (one registry per process)

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.explicit = False

    @classmethod
    def open(cls, staging: Path) -> _Declared:
        with cls._lock:
            return cls._open.setdefault(staging, cls())

    @classmethod
    def close(cls, staging: Path) -> None:
        with cls._lock:
            cls._open.pop(staging, None)

    @classmethod
    def add(cls, path: Path, *, strict: bool) -> None:
        full = Path(os.path.abspath(path))
        with cls._lock:
            for staging, declared in cls._open.items():
                if full.is_relative_to(staging) and full != staging:
                    declared.names.add(full.relative_to(staging).as_posix())
                    declared.explicit |= strict
                    return
        if strict:
            raise CommitStateError(
                f"declare({str(path)!r}): the path is not inside the staging directory of "
                "an open distributed_commit in this process; declare the files written "
                "inside the `with distributed_commit(...) as path:` block, below path"
            )


def load_dcp(
    state: dict[str, Any],
    checkpoint: Checkpoint | str | os.PathLike[str],
    *,
    process_group: dist.ProcessGroup | None = None,
) -> None:
    """Load a torch DCP checkpoint (saved with ``dcp.save(state, checkpoint_id=path)``
    inside :func:`distributed_commit`) into ``state``, in place, on every rank."""
    from torch.distributed.checkpoint.state_dict_loader import load

    path = checkpoint.path if isinstance(checkpoint, Checkpoint) else Path(checkpoint)
    load(state, checkpoint_id=path, process_group=process_group)
