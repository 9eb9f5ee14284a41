"""Actions of the model check at the edges the attack rounds found: an amend into nested
directories, a deduplicated commit, a carry from a source replaced by a same-size file,
a joined block failing in another thread, ``clean(force=True)`` inside an open commit, a
keep-every retention, a replace that keeps the older save's aliases, an async save after
a failed one; and from the attack on the model check itself: a plain ``clean()`` inside an
open commit, ``verify()`` of a step missing a file, a retention keeping two steps.

Each is a pair (``run`` on a :class:`~atomic_ckpt.CheckpointDir`, ``apply`` to a
:class:`~atomic_ckpt.testing.model.RootModel`) like those of
:mod:`atomic_ckpt.testing.actions`; :mod:`atomic_ckpt.testing.alphabet` names them.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path

from atomic_ckpt import (
    AsyncCommitter,
    CheckpointDir,
    CommitStateError,
    RetentionPolicy,
    VerificationError,
)
from atomic_ckpt.testing.actions import PART, A, B, Boom, _commit, _write
from atomic_ckpt.testing.model import Refused, RootModel, Saved, files_of
from atomic_ckpt.testing.parts import CARRY_SOURCE, Apply, Run, _carried

__all__ = ["DEDUP", "EDGES", "LIVE_EDGES", "MULTI_EDGES", "NESTED"]

NESTED: dict[str, bytes] = {"extra/deep/new.bin": b"d" * 11}
"""What ``amend_nested`` writes: a file two directories down, beside a carried one."""

DEDUP: dict[str, bytes] = {"model.bin": b"D" * 33, "extra/opt.bin": b"b" * 20}
"""What ``commit_dedup`` writes: ``model.bin`` the size of ``B``'s with other bytes (it
must not be linked), ``extra/opt.bin`` equal to ``B``'s (it may be)."""


def amend_nested(c: CheckpointDir) -> None:
    """Amend step 2 with a file in a new nested directory: every file of step 2 (those in
    subdirectories too) stays, the new one is added."""
    with c.amend(2) as p:
        _write(p, NESTED)


def apply_amend_nested(m: RootModel) -> None:
    old = m.require_step(2)
    m.steps[2] = Saved(files_of({**dict(old.files), **NESTED}), old.metadata)


def commit_dedup(c: CheckpointDir) -> None:
    """Commit step 3 with ``dedup=True``: only files equal to the previous checkpoint's
    are linked, never one of the same size with other bytes."""
    with c.commit(3, dedup=True) as p:
        _write(p, DEDUP)


def carry_replaced(c: CheckpointDir) -> None:
    """Step 1's model.bin is replaced by another file of the same size and modification
    time (a new inode, other bytes), then carried: the carry must notice
    (VerificationError, nothing committed); the original file is put back."""
    source = c.path_of(1) / CARRY_SOURCE
    keep = c.root.parent / "carry-original.bin"
    replaced = source.is_file() and not source.is_symlink()
    if replaced:
        st = os.stat(source)
        os.link(source, keep)
        tmp = source.with_name(CARRY_SOURCE + ".new")
        tmp.write_bytes(bytes(255 - b for b in source.read_bytes()))
        os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
        os.rename(tmp, source)
    try:
        with c.commit(3, carry={CARRY_SOURCE: 1}) as p:
            _write(p, PART)
    finally:
        if replaced:
            os.rename(keep, source)


def apply_carry_replaced(m: RootModel) -> None:
    _carried(m, m.require_step(1), CARRY_SOURCE)
    raise Refused(VerificationError, "the source was replaced since its commit")


def join_thread_raises(c: CheckpointDir) -> None:
    """A block joined from another thread raises (that thread swallows it): the outer
    commit must not publish (CommitStateError), as when the same thread's block raises."""

    def part() -> None:
        try:
            with c.commit(3, join=True) as q:
                _write(q, PART)
                raise Boom("a part written in another thread failed")
        except Boom:
            pass

    with c.commit(3) as p:
        _write(p, A)
        worker = threading.Thread(target=part)
        worker.start()
        worker.join()


def clean_force_in_commit(c: CheckpointDir) -> None:
    """``clean(force=True)`` while this process has a commit open: the live staging dir
    (its lock held) is left alone, and the commit publishes."""
    with c.commit(3) as p:
        _write(p, A)
        c.clean(force=True)


def clean_in_commit(c: CheckpointDir) -> None:
    """``clean()`` (not forced) while this process has a commit open: the live staging
    dir is left alone, and the commit publishes."""
    with c.commit(3) as p:
        _write(p, A)
        c.clean()


def verify_damaged(c: CheckpointDir) -> None:
    """Step 1's model.bin is moved away by hand, then ``verify(1)`` runs: it must name
    the missing file (VerificationError); the file is put back after."""
    source = c.path_of(1) / CARRY_SOURCE
    keep = c.root.parent / "verify-original.bin"
    moved = source.is_file() and not source.is_symlink()
    if moved:
        os.rename(source, keep)
    try:
        c.verify(1)
    finally:
        if moved:
            os.rename(keep, source)


def apply_verify_damaged(m: RootModel) -> None:
    if CARRY_SOURCE in dict(m.require_step(1).files):
        raise Refused(VerificationError, "a file the manifest lists is missing")


def commit_retain_two(c: CheckpointDir) -> None:
    """Commit step 3 with ``retain=RetentionPolicy.last(2)``: the two highest steps stay
    (named checkpoints are not steps: they count for nothing)."""
    with c.commit(3, retain=RetentionPolicy.last(2)) as p:
        _write(p, A)


def async_after_failure(c: CheckpointDir) -> None:
    """A background save fails; the next ``save`` raises its error and starts nothing."""
    committer = AsyncCommitter(c)
    try:

        def fail(d: Path) -> None:
            _write(Path(d), A)
            raise Boom("the first background save failed")

        committer.save(3, fail)
        committer.save(3, lambda d: _write(Path(d), B))
    finally:
        committer.close()


def _retain_every(c: CheckpointDir) -> None:
    c.retain(keep_every=2)


def _apply_retain_every(m: RootModel) -> None:
    m.retain(keep_every=2)


def refuse(exc: type[BaseException], why: str) -> Apply:
    def apply(m: RootModel) -> None:
        raise Refused(exc, why)

    return apply


EDGES: Mapping[str, tuple[Run, Apply]] = {
    "amend_nested": (amend_nested, apply_amend_nested),
    "commit_dedup": (commit_dedup, _commit(3, DEDUP)[1]),
    "carry_replaced": (carry_replaced, apply_carry_replaced),
    "join_thread_raises": (join_thread_raises, refuse(CommitStateError, "a joined block raised")),
    "clean_force_in_commit": (clean_force_in_commit, _commit(3, A)[1]),
    # a replace of step 2 (alias a) adding alias b, replace_aliases=False: a stays
    "commit_keep_aliases": _commit(2, A, aliases=("b",)),
    "async_save_after_failure": (async_after_failure, refuse(Boom, "the first save raised")),
    "clean_in_commit": (clean_in_commit, _commit(3, A)[1]),
    "verify_damaged": (verify_damaged, apply_verify_damaged),
}
"""The actions of this module by name."""

MULTI_EDGES: Mapping[str, tuple[Run, Apply, Apply | None]] = {
    "retain_every": (_retain_every, _apply_retain_every, None),
    "commit_retain_two": (commit_retain_two, _commit(3, A, keep_last=2)[1], _commit(3, A)[1]),
}
"""``retain_every`` (``keep_every=2`` alone: only the latest-always rule keeps an odd
latest step) and ``commit_retain_two`` (its first phase, the commit, as ``midway``),
added with ``multi`` (a retention deletes steps one by one): (run, apply, midway)."""

LIVE_EDGES = frozenset({"carry_replaced", "verify_damaged"})
"""Checked live only, as ``carry_changed`` (the action changes a committed file itself)."""
