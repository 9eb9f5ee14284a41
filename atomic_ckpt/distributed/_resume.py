"""Resumes: rank 0 picks for every rank (resume); the ranks share verifying (resume_verified).

The verified resume is split among ranks: each rank hashes the files it loads, rank 0 the
rest and the tree, and all keep or drop the candidate together.

The steps of :func:`atomic_ckpt.distributed.resume_verified`, on every rank:

1. the ranks exchange their ``read`` sets, once;
2. rank 0 picks the candidates, newest first, as ``CheckpointDir.resume_verified``
   does (its listing, warnings and refusals), and broadcasts each one (its marker
   read whole, so every rank checks against the same manifest);
3. every rank verifies its part of it: the files of its ``read`` that the manifest
   lists are mapped, hashed and kept; rank 0 also walks the tree (types, sizes,
   added entries, the marker's own checks) and hashes the files no rank reads;
4. the ranks exchange their outcomes: if a rank's part did not verify, every rank
   drops its views and rank 0 passes the candidate over (warning with every rank's
   reasons) and goes on with the next older one; if a rank failed otherwise, every
   rank raises;
5. rank 0 broadcasts the end: the step chosen, or None, or why there is none.

(Private: used by :mod:`atomic_ckpt.distributed`.)
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, Literal

import torch.distributed as dist

from atomic_ckpt import (
    Checkpoint,
    CheckpointDir,
    CheckpointError,
    DistributedCommitError,
    VerificationError,
    VerifiedCheckpoint,
)
from atomic_ckpt._core.l1_names.names import not_one_string
from atomic_ckpt._core.l3_formats import verify as _verify
from atomic_ckpt.distributed._commit import DEFAULT_TIMEOUT, _single_process
from atomic_ckpt.distributed._ranks import _coordination_group, _describe, _Ranks, raise_failures

Views = dict[str, memoryview]
Outcome = tuple[Literal["verify", "error"], tuple[str, ...]] | None
"""A rank's part of one candidate: None (it verified), ``("verify", problems)`` (it does
not verify: pass it over), ``("error", (description,))`` (something else failed)."""


def resume_verified_ranks(
    ckpts: CheckpointDir, ranks: _Ranks, read: Collection[str], *, fresh: bool
) -> VerifiedCheckpoint | None:
    """Steps 1-5 on this rank (see the module's notes)."""
    mine = frozenset(read)
    reads = ranks.all_gather(sorted(mine), "exchanging the files each rank reads")
    if ranks.rank == 0:
        others = frozenset(p for r, paths in enumerate(reads) if r != 0 for p in paths)
        return _lead(ckpts, ranks, mine, others - mine, fresh=fresh)
    return _follow(ckpts, ranks, mine)


def _lead(
    ckpts: CheckpointDir,
    ranks: _Ranks,
    mine: frozenset[str],
    elsewhere: frozenset[str],
    *,
    fresh: bool,
) -> VerifiedCheckpoint | None:
    """Rank 0: the candidates through ``ckpts.resume_verified``, each verified by all."""
    together = [False]  # a failure the other ranks know of already: no closing broadcast

    def verifier(ckpt: Checkpoint, read: Collection[str]) -> Mapping[str, memoryview]:
        together[0] = True  # from here, a lost rank or a failed part ends every rank
        ranks.broadcast(("check", ckpt), "sending rank 0's resume candidate")
        views, outcome, exc = _part(ckpts, ckpt, read, only=None, elsewhere=elsewhere)
        outcomes = ranks.all_gather(outcome, "exchanging the ranks' verify outcomes")
        _raise_errors(outcomes, exc, rank=0, step=ckpt.step)
        together[0] = False
        if any(o is not None for o in outcomes):
            _drop(views)
            raise _rejection(ckpt, outcomes)
        return views

    found: VerifiedCheckpoint | None = None
    problem: Exception | None = None
    try:
        found = ckpts.resume_verified(mine, fresh=fresh, verifier=verifier)
    except Exception as exc:
        if together[0]:
            raise
        problem = exc
    # Rank 0's own error (ours pickle with their attributes) is raised on every rank.
    shared = problem if isinstance(problem, CheckpointError) else None
    chosen = None if found is None else found.checkpoint.step
    ranks.broadcast(("done", (chosen, _describe(problem), shared)), "ending the resume")
    if problem is not None:
        raise problem
    return found


def _follow(ckpts: CheckpointDir, ranks: _Ranks, mine: frozenset[str]) -> VerifiedCheckpoint | None:
    """A rank other than 0: verify each candidate rank 0 sends, until it sends the end."""
    candidate: Checkpoint | None = None
    views: Views = {}
    while True:
        message: tuple[str, Any] = ("", None)
        kind, payload = ranks.broadcast(message, "waiting for rank 0's resume candidate")
        if kind != "check":
            break
        candidate = payload
        views, outcome, exc = _part(ckpts, candidate, mine, only=mine, elsewhere=())
        outcomes = ranks.all_gather(outcome, "exchanging the ranks' verify outcomes")
        _raise_errors(outcomes, exc, rank=ranks.rank, step=candidate.step)
        if any(o is not None for o in outcomes):
            _drop(views)
            views = {}
    chosen, why, shared = payload
    if shared is not None:
        raise shared
    if why is not None:
        raise DistributedCommitError(
            f"rank 0 could not choose a checkpoint to resume from: {why}", ranks=(0,)
        )
    if chosen is None:
        _drop(views)
        return None
    assert candidate is not None  # the last candidate, verified by every rank
    assert candidate.step == chosen
    return VerifiedCheckpoint(candidate, views)


def _part(
    ckpts: CheckpointDir,
    ckpt: Checkpoint,
    read: Collection[str],
    *,
    only: Collection[str] | None,
    elsewhere: Collection[str],
) -> tuple[Views, Outcome, Exception | None]:
    """This rank's part of verifying ``ckpt``: its views, its outcome and its own error."""
    try:
        views = _verify.verify(
            ckpt, workers=ckpts.workers, keep=read, only=only, hashed_elsewhere=elsewhere
        )
    except VerificationError as exc:
        return {}, ("verify", exc.problems or (str(exc),)), None
    except Exception as exc:
        return {}, ("error", (_describe(exc) or "",)), exc
    return views, None, None


def _raise_errors(outcomes: list[Outcome], mine: Exception | None, *, rank: int, step: int) -> None:
    """Where a rank's part failed other than by not verifying, every rank raises: that rank
    its own error, the others a DistributedCommitError naming it."""
    failed = [(r, o[1][0]) for r, o in enumerate(outcomes) if o is not None and o[0] == "error"]
    what = f"verifying checkpoint step {step}"
    raise_failures(mine, failed, rank=rank, step=step, phase="for the resume", what=what)


def _rejection(ckpt: Checkpoint, outcomes: list[Outcome]) -> VerificationError:
    """One VerificationError for the candidate, with each problem and the ranks that found it."""
    by_problem: dict[str, list[int]] = {}
    for r, outcome in enumerate(outcomes):
        for problem in () if outcome is None else outcome[1]:
            by_problem.setdefault(problem, []).append(r)
    problems = tuple(
        f"rank {', '.join(map(str, rs))}: {problem}" for problem, rs in by_problem.items()
    )
    more = f" (and {len(problems) - 1} more: see .problems)" if len(problems) > 1 else ""
    return VerificationError(problems[0] + more, path=ckpt.path, step=ckpt.step, problems=problems)


def _drop(views: Views) -> None:
    """Let go of the mappings of a candidate that was passed over."""
    for view in views.values():
        with contextlib.suppress(BufferError):  # (still exported somewhere: freed with it)
            view.release()
    views.clear()


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
    not_one_string("read", read)
    if _single_process(group):
        return ckpts.resume_verified(read, fresh=fresh)
    ranks = _Ranks(_coordination_group(group, timeout), None, timeout)
    return resume_verified_ranks(ckpts, ranks, read, fresh=fresh)


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
