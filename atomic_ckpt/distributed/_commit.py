"""Commits: every rank writes (distributed_commit), or rank 0 alone (rank0_commit)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import threading
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any, SupportsIndex

import torch.distributed as dist

from atomic_ckpt import (
    CheckpointDir,
    Commit,
    CommitStateError,
    DiskFullError,
    DistributedCommitError,
    DistributedNotInitializedError,
    RetentionPolicy,
)
from atomic_ckpt._core.l1_names.errors import disk_full
from atomic_ckpt._core.l1_names.names import step_of
from atomic_ckpt._core.l4_protocol import carry as _carry
from atomic_ckpt._core.l4_protocol.root import check_step
from atomic_ckpt.distributed._flush import Declared, flush_declared, marker_files, sweep_undeclared
from atomic_ckpt.distributed._ranks import (
    _all_entered,
    _coordination_group,
    _describe,
    _failures,
    _Ranks,
    raise_failures,
)

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
    dedup: bool | int | str = False,
    replace_unusable: bool = False,
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
    rank 0 after the commit is durable (only rank 0 deletes). ``dedup`` as for
    ``ckpts.commit`` (rank 0 links the files equal to the previous checkpoint's).
    ``replace_unusable`` as for
    ``ckpts.commit``: a step directory holding a checkpoint a newer atomic_ckpt wrote, or
    one moved there by hand, is refused on every rank (rank 0 checks, before anything is
    written) unless it is True.

    It is collective: called on some ranks only (say inside ``if rank == 0:``,
    followed by a barrier) it cannot complete, so every rank first checks that
    all entered, and raises :class:`~atomic_ckpt.DistributedCommitError` naming
    the missing ranks after ``entry_timeout`` seconds instead of hanging. (A save
    that rank 0 alone writes is :func:`rank0_commit`.)

    Without a process group (torch.distributed not initialized: a single-process
    run of the same script) it is ``ckpts.commit(step, ...)``, so one training script
    serves both without branching.
    """
    step = check_step(step)  # a bool is no step, as for ckpts.commit
    if _single_process(group):  # no process group: one process is every rank
        with ckpts.commit(
            step,
            metadata=metadata,
            retain=retain,
            dedup=dedup,
            replace_unusable=replace_unusable,
        ) as staging:
            Declared.open(staging)  # declare() and rank_path() work as on rank 0
            try:
                yield staging
            finally:
                Declared.close(staging)
        return
    _all_entered(group, "distributed_commit", entry_timeout, step)
    ranks = _Ranks(_coordination_group(group, timeout), step, timeout)
    # 1. Rank 0 creates the staging dir (its lock first) and broadcasts its name.
    commit, staging = _begin(
        ckpts,
        ranks,
        step,
        metadata=metadata,
        retain=retain,
        dedup=dedup,
        replace_unusable=replace_unusable,
    )
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
    replace_unusable: bool = False,
) -> Iterator[Path | None]:
    """Commit a checkpoint that rank 0 alone writes (a model every rank holds whole),
    while the other ranks wait for it.

    Enter it on every rank of ``group``: rank 0 gets the staging directory and commits
    it (``ckpts.commit``, or ``ckpts.commit_named`` when ``step`` is a name such as
    ``"interrupted"``; a string naming a step, ``"4"`` or ``"checkpoint-4"``, is that step,
    as for ``ckpts.staging``) when its block ends; the other ranks get None and, leaving
    the block, wait until rank 0's commit is durable, so no rank goes on (or resumes)
    before the checkpoint exists. If rank 0's save fails, it raises its own error and
    the others a :class:`~atomic_ckpt.DistributedCommitError` naming it; if rank 0 dies
    or hangs, the others raise DistributedCommitError (at once for a lost connection,
    after ``timeout`` seconds for a hang) instead of gloo's "connection closed" or an
    NCCL hang. An error in another rank's block is that rank's own and stops nothing.
    ``metadata``, ``retain`` (steps only), ``aliases``, ``replace_aliases`` and
    ``replace_unusable`` as for ``ckpts.commit`` (a refusal to replace an unusable
    checkpoint is rank 0's error, and DistributedCommitError on the other ranks).

    ``join=True`` inside an enclosing ``rank0_commit`` of the same step or name (on
    every rank, as SPMD code nests): yields the enclosing block's directory (None off
    rank 0) and runs no collective: the outermost block commits. This is how a
    ``save_checkpoint()`` that commits when called alone adds to a commit the trainer
    opened around it. The joined block is part of the enclosing commit, by the rules of
    ``ckpts.commit(..., join=True)``: on rank 0 an exception leaving it aborts the
    enclosing commit (whose end then raises CommitStateError there and
    DistributedCommitError on the other ranks, even if the caller swallowed the error),
    its ``metadata``, ``aliases``, ``replace_aliases`` and ``retain`` merge into the
    enclosing commit's (a contradicting one is a ValueError that aborts it), and the
    enclosing commit waits for blocks joined from other threads. On another rank, where
    nothing is written, a joined block's error is that rank's own: its enclosing block
    ends with CommitStateError chained from it, and rank 0's commit goes on. Without an
    enclosing one it commits as usual, unless the step or name is already committed:
    then rank 0 raises CommitStateError naming ``amend`` and the other ranks
    DistributedCommitError, since one part must not replace the whole checkpoint.

    Without a process group it is ``ckpts.commit(step, ...)`` (the path, never None),
    with ``join`` as for ``ckpts.commit``.
    """
    target: int | str = step if isinstance(step, str) else check_step(step)
    if isinstance(target, str):  # "4" (and "checkpoint-4") is step 4, as everywhere
        number_of = step_of(target, ckpts.prefix)
        target = target if number_of is None else number_of
    name = target if isinstance(target, str) else None
    number = None if isinstance(target, str) else target
    key = (str(ckpts.root), target)
    options: dict[str, Any] = {
        "metadata": metadata,
        "aliases": aliases,
        "replace_aliases": replace_aliases,
        "replace_unusable": replace_unusable,
    }
    if isinstance(target, str):
        if retain is not None:
            raise ValueError(f"retain= applies to step checkpoints, not the named one {name!r}")
        committed = functools.partial(ckpts.commit_named, target, **options)
    else:
        committed = functools.partial(ckpts.commit, target, retain=retain, **options)
    what = f"{name!r}" if name is not None else f"step {number}"
    enclosing = _enclosing(key) if join else None
    if enclosing is not None:
        if enclosing.path is None:  # another rank: nothing written here, nothing to abort
            try:
                yield None
            except BaseException as exc:
                full = disk_full(exc, ckpts.root, f"the block joined to the commit of {what}")
                enclosing.failed.append(exc if full is None else full)
                if full is not None:  # worded as a single-process join's (issue 30)
                    full.step = number
                    raise full from exc
                raise
            return
        with committed(join=True) as path:  # rank 0: joins the enclosing block's commit
            yield path
        return
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
            # join=True with nothing enclosing: commits, unless the target is committed
            alone = join and ckpts.staging(target) is None
            with committed(join=alone) as path, _open_rank0(key, path):
                yield path
        except BaseException as exc:
            outcome = exc
    else:
        try:
            with _open_rank0(key, None) as opened:
                yield None
            if opened.failed:
                raise CommitStateError(
                    f"a block that joined this rank's rank0_commit of {what} failed; rank "
                    f"0's commit was not affected. {_failure(opened.failed[0])}",
                    step=number,
                ) from opened.failed[0]
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


def _failure(exc: BaseException) -> str:
    """How a joined block's error reads in the CommitStateError that names it."""
    return str(exc) if isinstance(exc, DiskFullError) else f"It raised {exc!r}"


@dataclasses.dataclass
class _Opened:
    """An open rank0_commit block: its directory (None off rank 0), and the errors of the
    blocks that joined it (recorded off rank 0, where no commit is open to abort)."""

    path: Path | None
    failed: list[BaseException] = dataclasses.field(default_factory=list)


_OPEN_RANK0: dict[tuple[str, int | str], list[_Opened]] = {}
"""The rank0_commit blocks open in this process, by (root, step or name), oldest first:
the newest is what ``join=True`` joins. Several may be open at once (two threads saving
one step, each a whole save): each block's end removes its own record only."""
_RANK0_LOCK = threading.Lock()


def _enclosing(key: tuple[str, int | str]) -> _Opened | None:
    """The newest rank0_commit block of ``key`` open in this process, or None."""
    with _RANK0_LOCK:
        opened = _OPEN_RANK0.get(key)
        return opened[-1] if opened else None


@contextlib.contextmanager
def _open_rank0(key: tuple[str, int | str], path: Path | None) -> Iterator[_Opened]:
    opened = _Opened(path)
    with _RANK0_LOCK:
        _OPEN_RANK0.setdefault(key, []).append(opened)
    try:
        yield opened
    finally:
        with _RANK0_LOCK:
            rest = [o for o in _OPEN_RANK0.get(key, ()) if o is not opened]
            if rest:
                _OPEN_RANK0[key] = rest
            else:
                _OPEN_RANK0.pop(key, None)


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
    dedup: bool | int | str,
    replace_unusable: bool,
) -> tuple[Commit | None, Path]:
    """Step 1: rank 0 takes its staging lock and creates the staging dir; every rank
    receives its name. Returns rank 0's commit (None on the other ranks) and the dir."""
    commit: Commit | None = None
    problem: BaseException | None = None
    if ranks.rank == 0:
        try:
            commit = ckpts.begin(
                step,
                metadata=metadata,
                retain=retain,
                dedup=dedup,
                replace_unusable=replace_unusable,
            )
            commit._pending = _carry.Listed("a distributed_commit (the ranks list its files)")
            commit.as_block()  # a commit of the step nested in the block is refused
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
