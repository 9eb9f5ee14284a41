"""Multi-rank commit and resume over ``torch.distributed`` (PROTOCOL.md, "Several ranks").

::

    from atomic_ckpt import CheckpointDir
    from atomic_ckpt.distributed import distributed_commit, rank_path, resume, resume_verified

    ckpts = CheckpointDir("/shared/run1")
    with distributed_commit(ckpts, step) as path:     # on every rank
        torch.save(shard, rank_path(path / "model.pt"))  # model.rank<r>.pt, declared
        if rank == 0:
            save_config(path / "config.json")
            declare(path / "config.json")              # flushed by rank 0 alone
    ckpt = resume(ckpts)                               # the same on every rank
    found = resume_verified(ckpts, [mine])             # verified, each byte read once

    with rank0_commit(ckpts, step) as path:           # a save rank 0 alone writes
        if path is not None:                            # rank 0; the others wait
            save_model(path)

Every function here also runs without a process group (one process is rank 0), so a
script that trains on one process or many needs no ``dist.is_initialized()`` branches.

A commit, on every rank of the group, in order:

1. rank 0 takes its staging lock, creates ``N.tmp-<uuid>/`` and broadcasts the
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

With its helpers ``_ranks`` (the collectives), ``_flush`` (steps 4 and 5:
which rank flushes which file) and ``_resume`` (the verified resume split among
ranks: :func:`resume_verified`), this is the only part of ``atomic_ckpt`` that
imports torch.distributed.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import operator
import os
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any, SupportsIndex

import torch.distributed as dist

from atomic_ckpt import (
    Checkpoint,
    CheckpointDir,
    CheckpointError,
    Commit,
    DistributedCommitError,
    DistributedNotInitializedError,
    RetentionPolicy,
    VerifiedCheckpoint,
)
from atomic_ckpt._core.l1_names import public as _public
from atomic_ckpt.distributed._flush import Declared, flush_declared, marker_files, sweep_undeclared
from atomic_ckpt.distributed._ranks import (
    _all_entered,
    _coordination_group,
    _describe,
    _failures,
    _Ranks,
    raise_failures,
)
from atomic_ckpt.distributed._resume import resume_verified_ranks

__all__ = [
    "DEFAULT_ENTRY_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "declare",
    "distributed_commit",
    "load_dcp",
    "rank0_commit",
    "rank_path",
    "resume",
    "resume_verified",
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
    the missing ranks after ``entry_timeout`` seconds instead of hanging. (A save
    that rank 0 alone writes is :func:`rank0_commit`.)

    Without a process group (torch.distributed not initialized: a single-process
    run of the same script) it is ``ckpts.commit(step, ...)``, so one training script
    serves both without branching.
    """
    step = operator.index(step)
    if _single_process(group):  # no process group: one process is every rank
        with ckpts.commit(step, metadata=metadata, retain=retain) as staging:
            Declared.open(staging)  # declare() and rank_path() work as on rank 0
            try:
                yield staging
            finally:
                Declared.close(staging)
        return
    _all_entered(group, "distributed_commit", entry_timeout, step)
    ranks = _Ranks(_coordination_group(group, timeout), step, timeout)
    # 1. Rank 0 creates the staging dir (its lock first) and broadcasts its name.
    commit, staging = _begin(ckpts, ranks, step, metadata=metadata, retain=retain)
    declared_here = Declared.open(staging)
    try:
        # 2. Every rank writes its files (and declares them, with rank_path or declare).
        mine: BaseException | None = None
        try:
            yield staging
        except BaseException as exc:
            mine = exc
        finally:
            Declared.close(staging)
        # 3. Agree that every rank wrote (the barrier after the writes).
        _agree_written(ranks, step, mine)
        # 4. Every rank fsyncs and hashes what it declared: each file once, by its writer.
        declared = flush_declared(ckpts, ranks, step, staging, declared_here.names)
        # 5. The fallback sweep of what no rank declared; rank 0 fsyncs the directories.
        listing, shares = sweep_undeclared(
            ckpts, ranks, step, staging, declared, declared_all=declared_here.explicit
        )
    except BaseException as exc:
        if commit is not None:
            commit.abort(exc)
        raise
    # 6. Rank 0: the marker (listing every rank's files), promote, fsync the root,
    #    then the retention policy.
    outcome: BaseException | None = None
    if commit is not None:
        files = marker_files(listing, declared, shares)
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


@contextlib.contextmanager
def rank0_commit(
    ckpts: CheckpointDir,
    step: SupportsIndex | str,
    *,
    metadata: Mapping[str, Any] | None = None,
    group: dist.ProcessGroup | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    retain: RetentionPolicy | None = None,
    aliases: Collection[str] = (),
    replace_aliases: bool = False,
    join: bool = False,
    entry_timeout: float = DEFAULT_ENTRY_TIMEOUT,
) -> Iterator[Path | None]:
    """Commit a checkpoint that rank 0 alone writes (a model every rank holds whole),
    while the other ranks wait for it.

    Enter it on every rank of ``group``: rank 0 gets the staging directory and commits
    it (``ckpts.commit``, or ``ckpts.commit_named`` when ``step`` is a name such as
    ``"interrupted"``) when its block ends; the other ranks get None and, leaving the
    block, wait until rank 0's commit is durable, so no rank goes on (or resumes)
    before the checkpoint exists. If rank 0's save fails, it raises its own error and
    the others a :class:`~atomic_ckpt.DistributedCommitError` naming it; if rank 0 dies
    or hangs, the others raise DistributedCommitError (at once for a lost connection,
    after ``timeout`` seconds for a hang) instead of gloo's "connection closed" or an
    NCCL hang. An error in another rank's block is that rank's own and stops nothing.
    ``metadata``, ``retain`` (steps only), ``aliases`` and ``replace_aliases`` as for
    ``ckpts.commit``.

    ``join=True`` inside an enclosing ``rank0_commit`` of the same step or name (on
    every rank, as SPMD code nests): yields the enclosing block's directory (None off
    rank 0) and does nothing else, no collective either: the outermost block commits.
    This is how a ``save_checkpoint()`` that commits when called alone adds to a commit
    the trainer opened around it. Without an enclosing one it commits as usual.

    Without a process group it is ``ckpts.commit(step, ...)`` (the path, never None),
    with ``join`` as for ``ckpts.commit``.
    """
    target: int | str = step if isinstance(step, str) else operator.index(step)
    name = target if isinstance(target, str) else None
    number = None if isinstance(target, str) else target
    key = (str(ckpts.root), target)
    if join and key in _OPEN_RANK0:
        yield _OPEN_RANK0[key]
        return
    options: dict[str, Any] = {
        "metadata": metadata,
        "aliases": aliases,
        "replace_aliases": replace_aliases,
    }
    if isinstance(target, str):
        if retain is not None:
            raise ValueError(f"retain= applies to step checkpoints, not the named one {name!r}")
        committed = functools.partial(ckpts.commit_named, target, **options)
    else:
        committed = functools.partial(ckpts.commit, target, retain=retain, **options)
    what = f"{name!r}" if name is not None else f"step {number}"
    if _single_process(group):
        with committed(join=join) as path, _open_rank0(key, path):
            yield path
        return
    _all_entered(group, "rank0_commit", entry_timeout, number)
    ranks = _Ranks(_coordination_group(group, timeout), number, timeout)
    outcome: BaseException | None = None
    mine: BaseException | None = None
    if ranks.rank == 0:
        try:
            with committed(join=False) as path, _open_rank0(key, path):
                yield path
        except BaseException as exc:
            outcome = exc
    else:
        try:
            with _open_rank0(key, None):
                yield None
        except BaseException as exc:
            mine = exc
    why = ranks.broadcast(
        _describe(outcome), "waiting for rank 0 to commit its checkpoint", last=True
    )
    if outcome is not None:
        raise outcome
    if mine is not None:
        raise mine
    if why is not None:
        raise DistributedCommitError(
            f"rank 0 failed to commit {what}: {why}", step=number, ranks=(0,)
        )


_OPEN_RANK0: dict[tuple[str, int | str], Path | None] = {}
"""The rank0_commit blocks open in this process, by (root, step or name): what
``join=True`` joins (their directory on rank 0, None on the others)."""


@contextlib.contextmanager
def _open_rank0(key: tuple[str, int | str], path: Path | None) -> Iterator[None]:
    _OPEN_RANK0[key] = path
    try:
        yield
    finally:
        del _OPEN_RANK0[key]


def _single_process(group: dist.ProcessGroup | None) -> bool:
    """True where torch.distributed is not initialized (and no group was named)."""
    if dist.is_available() and dist.is_initialized():
        return False
    if group is not None:
        raise DistributedNotInitializedError(
            "a process group was given, but torch.distributed is not initialized"
        )
    return True


def _begin(
    ckpts: CheckpointDir,
    ranks: _Ranks,
    step: int,
    *,
    metadata: Mapping[str, Any] | None,
    retain: RetentionPolicy | None,
) -> tuple[Commit | None, Path]:
    """Step 1: rank 0 takes its staging lock and creates the staging dir; every rank
    receives its name. Returns rank 0's commit (None on the other ranks) and the dir."""
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
    return commit, ckpts.root / name


def _agree_written(ranks: _Ranks, step: int, mine: BaseException | None) -> None:
    """Step 3: the ranks exchange the outcomes of their writes. A rank that raised
    raises its own error (noting the others'); the rest raise one naming those ranks."""
    failed = _failures(ranks.all_gather(_describe(mine), "agreeing that every rank wrote"))
    raise_failures(mine, failed, rank=ranks.rank, step=step, phase="while writing")


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

    With ``verify=True`` rank 0 reads every file to hash it, and then each rank reads
    its files again to load them: :func:`resume_verified` reads each byte once, the
    ranks sharing the hashing and loading from the very pages they hashed.

    Without a process group (a single-process run) it is ``ckpts.resume_point(...)``.
    """
    if _single_process(group):
        return ckpts.resume_point(verify=verify, fresh=fresh)
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


def resume_verified(
    ckpts: CheckpointDir,
    read: Collection[str],
    *,
    group: dist.ProcessGroup | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    fresh: bool = False,
) -> VerifiedCheckpoint | None:
    """The newest checkpoint that verifies, the same on every rank, with the bytes of the
    files this rank loads as they were hashed: each byte is read from storage once.

    Collective: call it on every rank of ``group``, each with its own ``read`` (the
    checkpoint-relative paths this rank will load: its :func:`rank_path` files and the
    shared ones). The work of verifying is split: each rank maps and hashes the files
    of its ``read`` that the manifest lists, and keeps their views
    (:attr:`~atomic_ckpt.VerifiedCheckpoint.files`, for a loader such as
    ``atomic_ckpt.torch.load_state``); rank 0 hashes the files no rank reads and checks
    the rest as ``CheckpointDir.verify`` does (types, sizes, nothing added, the marker).
    A file that several ranks read is hashed by each of them, since each loads it.

    Rank 0 picks the candidates newest first, as ``CheckpointDir.resume_verified``
    does: one that does not verify on some rank is passed over on every rank (rank 0
    warns, naming the ranks and their reasons) for the next older one. None on every
    rank if none verifies; the refusals of :func:`resume` (such as
    :class:`~atomic_ckpt.UnusableCheckpointsError`) are raised on every rank, unless
    ``fresh``. A rank that crashes or hangs makes the others raise
    :class:`~atomic_ckpt.DistributedCommitError` (after ``timeout`` seconds for a
    hang, which must exceed the slowest rank's hashing).

    Without a process group (a single-process run) it is
    ``ckpts.resume_verified(read, fresh=fresh)``.
    """
    if _single_process(group):
        return ckpts.resume_verified(read, fresh=fresh)
    ranks = _Ranks(_coordination_group(group, timeout), None, timeout)
    return resume_verified_ranks(ckpts, ranks, read, fresh=fresh)


def rank_path(
    path: str | os.PathLike[str], rank: int | None = None, *, group: dist.ProcessGroup | None = None
) -> Path:
    """``dir/model.pt`` -> ``dir/model.rank<r>.pt``: the one-file-per-rank layout.

    ``rank`` defaults to this process's rank in ``group``. This rank's own name,
    made inside a :func:`distributed_commit`, is also declared (as by
    :func:`declare`): this rank alone fsyncs and hashes that file.
    """
    if rank is None:  # a single process (no process group) is rank 0
        rank = dist.get_rank(group) if not _single_process(group) else 0
        mine = True
    else:
        mine = dist.is_available() and dist.is_initialized() and rank == dist.get_rank(group)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank must be a non-negative int, got {rank!r}")
    p = Path(path)
    named = p.with_name(f"{p.stem}.rank{rank}{p.suffix}")
    if mine:
        Declared.add(named, strict=False)
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
        Declared.add(Path(path), strict=True)


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


_public.export(__name__, globals(), __all__)
