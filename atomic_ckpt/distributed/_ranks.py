"""The collectives of a multi-rank commit: a gloo coordination group per (group,
timeout), the entry check that names ranks which never entered, and the
broadcasts and gathers that turn a lost or hung rank into a clear error, and the
check of the ranks' flushed files against one listing of the staging dir.
(Private: used by :mod:`atomic_ckpt.distributed` and :mod:`atomic_ckpt.dcp`.)"""

from __future__ import annotations

import atexit
import contextlib
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch.distributed as dist

from atomic_ckpt._core.l1_names.errors import DistributedCommitError, DistributedNotInitializedError
from atomic_ckpt._core.l3_formats.manifest import FileEntry

if TYPE_CHECKING:
    from atomic_ckpt._core.l5_facade.checkpoint import CheckpointDir

_T = TypeVar("_T")
_GROUPS: dict[tuple[object, object, float, str], dist.ProcessGroup] = {}


def _release_groups() -> None:
    """At exit, tear down the cached coordination groups before the interpreter does.

    Left to interpreter teardown, a cached gloo group could be destroyed after
    the default group, and the process then aborted after the job had finished
    ("terminate called without an active exception", exit status -6; seen in
    3 of 8 two-rank runs here).
    """
    if dist.is_initialized():
        for pg in _GROUPS.values():
            with contextlib.suppress(Exception):
                dist.destroy_process_group(pg)
    _GROUPS.clear()


atexit.register(_release_groups)


def _coordination_group(
    group: dist.ProcessGroup | None, timeout: float, purpose: str = "commit"
) -> dist.ProcessGroup:
    """A gloo group of ``group``'s ranks whose collectives time out after ``timeout``.

    Made once per (group, timeout, purpose) and cached: like every collective, the
    first commit must be entered by all ranks of the group. gloo carries the small
    Python objects of the protocol whatever backend the training uses. A separate
    ``purpose`` gets a separate group: collectives that may run at the same time in
    different threads (an async DCP save in the background, the next save's check
    in the training thread) must never share one.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise DistributedNotInitializedError(
            "torch.distributed is not initialized: call "
            "torch.distributed.init_process_group() first (or use CheckpointDir.commit)"
        )
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    world = dist.group.WORLD
    key = (world, group, float(timeout), purpose)
    pg = _GROUPS.get(key)
    if pg is None:
        ranks = None if group is None else dist.get_process_group_ranks(group)
        try:
            made = dist.new_group(
                ranks=ranks,
                timeout=timedelta(seconds=timeout),
                backend="gloo",
                use_local_synchronization=group is not None,
            )
        except RuntimeError as exc:  # gloo's connectFullMesh: a rank died while connecting
            raise DistributedCommitError(
                f"rank {dist.get_rank()} lost contact with the other ranks while connecting "
                f"to them for the {purpose} (timeout {timeout:g}s): a rank crashed, hung or "
                f"is too slow (resume() after the restart shows what is complete). Cause: {exc}"
            ) from exc
        assert made is not None  # every caller is a member
        pg = _GROUPS[key] = made
    return pg


class _Ranks:
    """The collectives of one commit, with a lost or hung rank turned into a clear error."""

    def __init__(self, pg: dist.ProcessGroup, step: int | None, timeout: float) -> None:
        self.pg = pg
        self.rank = dist.get_rank(pg)
        self.size = dist.get_world_size(pg)
        self.step = step
        self.timeout = timeout
        self._src = dist.get_global_rank(pg, 0)

    def broadcast(self, obj: _T, what: str, *, last: bool = False) -> _T:
        box: list[Any] = [obj]
        call = lambda: dist.broadcast_object_list(box, src=self._src, group=self.pg)  # noqa: E731
        self._run(what, call, last=last)
        return box[0]  # type: ignore[no-any-return]

    def all_gather(self, obj: _T, what: str) -> list[_T]:
        out: list[Any] = [None] * self.size
        self._run(what, lambda: dist.all_gather_object(out, obj, group=self.pg))
        return out

    def _run(self, what: str, call: Callable[[], None], *, last: bool = False) -> None:
        try:
            call()
        except RuntimeError as exc:  # DistBackendError: gloo timeout or a closed connection
            if self.step is None:
                outcome = ""
            elif last:
                outcome = (
                    f" Rank 0 may have promoted step {self.step} before contact was lost; "
                    "resume() after the restart shows what is complete."
                )
            else:
                outcome = (
                    f" Rank 0 promotes step {self.step} only once every rank has reported "
                    "success, so unless the lost rank had already reported, nothing was "
                    "promoted; clean() removes a staging dir that a crashed rank 0 left."
                )
            raise DistributedCommitError(
                f"rank {self.rank} lost contact with the other ranks while {what} "
                f"(timeout {self.timeout:g}s): a rank crashed, hung or is too slow.{outcome} "
                f"Cause: {exc}",
                step=self.step,
            ) from exc


_ENTRIES: dict[tuple[int, ...], int] = {}
"""How many collective calls each set of ranks has entered (the same count on each rank)."""


def _all_entered(
    group: dist.ProcessGroup | None, call: str, timeout: float, step: int | None
) -> None:
    """Check that every rank of ``group`` entered ``call``; name the missing ones after
    ``timeout`` seconds.

    Through the default group's key-value store, before any collective runs or any
    group is created (creating a gloo group blocks until every rank joins, with the
    commit's long timeout), so a misuse leaves nothing in flight and the next correct
    call works. (``_get_default_store`` is torch's private accessor of that store.)
    """
    if not dist.is_available() or not dist.is_initialized():
        raise DistributedNotInitializedError(
            "torch.distributed is not initialized: call "
            "torch.distributed.init_process_group() first (or use CheckpointDir.commit)"
        )
    store = dist.distributed_c10d._get_default_store()
    members = tuple(
        dist.get_process_group_ranks(group) if group is not None else range(dist.get_world_size())
    )
    seq = _ENTRIES.get(members, 0)
    base = f"atomic_ckpt/entry/{'-'.join(map(str, members))}/"
    me = dist.get_rank()
    store.set(f"{base}{seq}/{me}", "1")
    try:
        store.wait([f"{base}{seq}/{r}" for r in members], timedelta(seconds=timeout))
    except Exception as exc:
        missing = [r for r in members if not store.check([f"{base}{seq}/{r}"])]
        store.delete_key(f"{base}{seq}/{me}")  # not entered after all: the next call reuses seq
        raise DistributedCommitError(
            f"{call} is collective, but rank(s) {missing} did not enter it within "
            f"{timeout:g}s (rank {me} waited). Call it on every rank of the group, not "
            "inside `if rank == 0:` (see 'Collective or not' in the README); a rank that "
            "is merely slow needs a larger entry_timeout",
            step=step,
        ) from exc
    if seq:  # every rank has finished the previous call: its key is no longer waited on
        store.delete_key(f"{base}{seq - 1}/{me}")
    _ENTRIES[members] = seq + 1


def _describe(exc: BaseException | None) -> str | None:
    if exc is None:
        return None
    notes = "".join(f" [{n}]" for n in getattr(exc, "__notes__", ()))
    return f"{type(exc).__name__}: {exc}{notes}"


def _failures(outcomes: list[str | None], skip: int | None = None) -> list[tuple[int, str]]:
    return [(r, why) for r, why in enumerate(outcomes) if why is not None and r != skip]


def _failure_error(
    step: int, failed: list[tuple[int, str]], phase: str, what: str | None = None
) -> DistributedCommitError:
    detail = "; ".join(f"rank {r}: {why}" for r, why in failed)
    outcome = "" if what is not None else ". Nothing was promoted"
    return DistributedCommitError(
        f"{what or f'the commit of step {step}'} failed {phase} on rank(s) "
        f"{', '.join(str(r) for r, _ in failed)} ({detail}){outcome}",
        step=step,
        ranks=tuple(r for r, _ in failed),
    )


def raise_failures(
    mine: BaseException | None,
    failed: list[tuple[int, str]],
    *,
    rank: int,
    step: int,
    phase: str,
    what: str | None = None,
) -> None:
    """After the ranks exchanged their outcomes: a rank that failed raises its own error
    (with the other failed ranks in a note); the rest raise one naming the failed ranks.
    ``what`` failed (default: the commit of ``step``, which then promoted nothing)."""
    if mine is not None:
        others = [(r, w) for r, w in failed if r != rank]
        if others:
            mine.add_note(
                "atomic_ckpt: other ranks failed too: "
                + "; ".join(f"rank {r}: {w}" for r, w in others)
            )
        raise mine
    if failed:
        raise _failure_error(step, failed, phase, what)


def checked_listing(
    ckpts: CheckpointDir,
    staging: Path,
    declared: Mapping[str, FileEntry],
    *,
    viewer: str,
    step: int | None = None,
) -> list[FileEntry]:
    """One listing of ``staging`` (names and sizes, no data read), checked against the
    entries the ranks flushed: each must be there with the type and size its writer
    recorded, else DistributedCommitError (``viewer`` says who looked)."""
    listing = ckpts.list_tree(staging)
    seen = {e.path: e for e in listing}
    for rel, entry in declared.items():
        found = seen.get(rel)
        if found is None or found.type != entry.type or found.size != entry.size:
            now = "missing" if found is None else f"a {found.type} of {found.size} bytes"
            raise DistributedCommitError(
                f"{staging / rel} was flushed by its writer as a {entry.type} of "
                f"{entry.size} bytes, but {viewer} now sees {now}: a rank changed it "
                "after writing it, or the filesystem does not show every rank the same "
                "files (on NFS, mount with lookupcache=positive or actimeo=0). Nothing "
                "was promoted",
                path=staging / rel,
                step=step,
            )
    return listing
