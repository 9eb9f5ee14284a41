"""Multi-rank commit and resume over ``torch.distributed`` (PROTOCOL.md, "Several ranks").

::

    from atomic_ckpt import CheckpointDir
    from atomic_ckpt.distributed import distributed_commit, rank_path, resume

    ckpts = CheckpointDir("/shared/run1")
    with distributed_commit(ckpts, step) as path:     # on every rank
        torch.save(shard, rank_path(path / "model.pt"))  # model.rank<r>.pt
    ckpt = resume(ckpts)                               # the same on every rank

A commit, on every rank of the group, in order:

1. rank 0 takes its staging lock, creates ``N.tmp-<uuid>/`` and broadcasts the
   name (or why it could not);
2. every rank writes its files into it (the ``with`` body);
3. the ranks exchange their outcomes (this is the barrier after the writes);
   if any rank raised, every rank raises and rank 0 removes the staging dir;
4. every rank lists the whole staging tree and fsyncs every file and
   subdirectory in it, so each rank certainly flushes what it wrote without
   having to say which files those are (fsync of a file another rank wrote
   and flushed is close to free); the files are split among the ranks for
   hashing, so each is read once; the ranks exchange their listings, hashes and
   outcomes, and a listing that differs from rank 0's is an error (the shared
   filesystem does not show every rank the same directory);
5. rank 0 alone writes the marker (a manifest of every rank's files), fsyncs
   the staging dir, promotes under the root lock, fsyncs the root and, with
   ``retain=``, applies the retention policy;
6. rank 0 broadcasts the outcome: no rank leaves the ``with`` block before the
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
)

__all__ = [
    "DEFAULT_ENTRY_TIMEOUT",
    "DEFAULT_TIMEOUT",
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
    try:
        # 2. Every rank writes its files.
        mine: BaseException | None = None
        try:
            yield staging
        except BaseException as exc:
            mine = exc
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
        # 4. Every rank fsyncs the tree (so what it wrote) and hashes its share.
        synced: tuple[str, list[FileEntry], dict[str, str]] | None = None
        try:
            synced = _sync_share(ckpts, staging, ranks.rank, ranks.size)
        except Exception as exc:
            mine = exc
        gathered = ranks.all_gather(
            (_describe(mine), synced[0] if synced else None, synced[2] if synced else {}),
            "agreeing that every rank flushed its files",
        )
        if mine is not None:
            raise mine
        failed = _failures([g[0] for g in gathered])
        if failed:
            raise _failure_error(step, failed, "while flushing")
        digests = [g[1] for g in gathered]
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
    # 5. Rank 0: the marker (listing every rank's files), promote, fsync the root,
    #    then the retention policy.
    outcome: BaseException | None = None
    if commit is not None and synced is not None:
        sums: dict[str, str] = {}
        for _, _, share in gathered:
            sums.update(share)
        try:
            commit.publish(files=[_with_checksum(e, sums) for e in synced[1]])
        except Exception as exc:
            outcome = exc
    # 6. Rank 0 tells every rank the outcome: the barrier after the promotion.
    why = ranks.broadcast(
        _describe(outcome), "waiting for rank 0 to promote the checkpoint", last=True
    )
    if outcome is not None:
        raise outcome
    if why is not None:
        raise DistributedCommitError(
            f"rank 0 failed to commit step {step}: {why}", step=step, ranks=(0,)
        )


def _sync_share(
    ckpts: CheckpointDir, staging: Path, rank: int, size: int
) -> tuple[str, list[FileEntry], dict[str, str]]:
    """fsync every file and subdirectory of ``staging``; hash every ``size``-th file.

    Returns a digest of the listing (to compare across ranks), the listing,
    and the checksums of this rank's share of the files.
    """
    entries = ckpts.sync_tree(staging, hash=False)
    listing = json.dumps([e.to_json() for e in entries]).encode()
    digest = hashlib.sha256(listing).hexdigest()
    share = [e.path for e in entries if e.type == "file"][rank::size]
    sums: dict[str, str] = {}
    if ckpts.checksum is not None and share:
        with ThreadPoolExecutor(max_workers=min(8, len(share))) as pool:
            found = pool.map(lambda rel: ckpts.checksum_file(staging / rel) or "", share)
            sums = dict(zip(share, found, strict=True))
    return digest, entries, sums


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

    ``rank`` defaults to this process's rank in ``group``.
    """
    if rank is None:
        rank = dist.get_rank(group)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank must be a non-negative int, got {rank!r}")
    p = Path(path)
    return p.with_name(f"{p.stem}.rank{rank}{p.suffix}")


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
