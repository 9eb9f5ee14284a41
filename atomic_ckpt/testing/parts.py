"""Actions of the model check for checkpoints made of parts: joined blocks carrying options,
a join with nothing open, ``rank0_commit`` (one process: rank 0), carried files, and a
block that raises inside each kind of save.

Each is a pair (``run`` on a :class:`~atomic_ckpt.CheckpointDir`, ``apply`` to a
:class:`~atomic_ckpt.testing.model.RootModel`) like those of
:mod:`atomic_ckpt.testing.actions`; :mod:`atomic_ckpt.testing.alphabet` names them.
``rank0_commit`` is imported when such an action runs (it imports torch.distributed),
so importing this module does not.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from atomic_ckpt import (
    AsyncCommitter,
    CheckpointDir,
    CheckpointNotFoundError,
    CommitStateError,
    RetentionPolicy,
    VerificationError,
    atomic_write,
)
from atomic_ckpt.testing.actions import NOTES, PART, A, B, Boom, _write
from atomic_ckpt.testing.model import Refused, RootModel, Saved

__all__ = ["CARRY_SOURCE", "LIVE_ONLY", "MULTI", "PARTS", "Apply", "Run"]

Run = Callable[[CheckpointDir], object]
Apply = Callable[[RootModel], None]

CARRY_SOURCE = "model.bin"
"""The file the carry actions take from a committed checkpoint."""


# ---- joined blocks with options, and a join with nothing open


def join_options(c: CheckpointDir) -> None:
    """A joined block's metadata and aliases merge into the commit it joins."""
    with c.commit(3, metadata={"loss": 0.5}) as p:
        _write(p, A)
        with c.commit(3, join=True, metadata={"part": 1}, aliases=("b",)) as q:
            _write(q, PART)


def apply_join_options(m: RootModel) -> None:
    m.legacy.pop(3, None)
    m.steps[3] = Saved.of({**A, **PART}, {"loss": 0.5, "part": 1})
    m.point(["b"], ("step", 3), replace=False)


def join_retain(c: CheckpointDir) -> None:
    """A joined block's retention policy is the commit's when the commit has none."""
    with c.commit(3) as p:
        _write(p, A)
        with c.commit(3, join=True, retain=RetentionPolicy.last(1)) as q:
            _write(q, PART)


def apply_join_retain_commit(m: RootModel) -> None:
    """Its first phase: the commit published, before the retention."""
    m.legacy.pop(3, None)
    m.steps[3] = Saved.of({**A, **PART})


def apply_join_retain(m: RootModel) -> None:
    apply_join_retain_commit(m)
    m.retain(keep_last=1)


def join_conflict(c: CheckpointDir) -> None:
    """A joined block's metadata key contradicts the commit's: ValueError, nothing published."""
    with c.commit(3, metadata={"loss": 0.5}) as p:
        _write(p, A)
        with c.commit(3, join=True, metadata={"loss": 0.9}) as q:
            _write(q, PART)


def join_retain_conflict(c: CheckpointDir) -> None:
    """A joined block's retain= contradicts the commit's: ValueError, nothing published."""
    with c.commit(3, retain=RetentionPolicy.last(2)) as p:
        _write(p, A)
        with c.commit(3, join=True, retain=RetentionPolicy.last(1)) as q:
            _write(q, PART)


def join_replace_aliases(c: CheckpointDir) -> None:
    """A joined block's replace_aliases=True is or-ed into the commit it joins: step 2's
    older aliases go."""
    with c.commit(2) as p:
        _write(p, A)
        with c.commit(2, join=True, aliases=("b",), replace_aliases=True) as q:
            _write(q, PART)


def apply_join_replace_aliases(m: RootModel) -> None:
    m.legacy.pop(2, None)
    m.steps[2] = Saved.of({**A, **PART})
    m.point(["b"], ("step", 2), replace=True)


def join_alone(c: CheckpointDir) -> None:
    """``join=True`` with no commit open: commits step 1, unless step 1 is committed."""
    with c.commit(1, join=True) as p:
        _write(p, PART)


def apply_join_alone(m: RootModel) -> None:
    if 1 in m.steps:
        raise Refused(CommitStateError, "join=True over committed step 1 with nothing open")
    m.legacy.pop(1, None)
    m.steps[1] = Saved.of(PART)


def join_named_alone(c: CheckpointDir) -> None:
    with c.commit_named("interrupted", join=True) as p:
        _write(p, PART)


def apply_join_named_alone(m: RootModel) -> None:
    if "interrupted" in m.named:
        raise Refused(CommitStateError, "join=True over the committed 'interrupted'")
    m.named["interrupted"] = Saved.of(PART)


def named_own_alias(c: CheckpointDir) -> None:
    """An alias equal to the checkpoint's own name: ValueError before anything is written."""
    with c.commit_named("interrupted", aliases=("interrupted",)) as p:
        _write(p, A)


# ---- rank0_commit, one process (rank 0 of no process group)


@contextlib.contextmanager
def _rank0(c: CheckpointDir, target: int | str, **options: Any) -> Iterator[Path]:
    from atomic_ckpt.distributed import rank0_commit

    with rank0_commit(c, target, **options) as path:
        assert path is not None  # one process is rank 0
        yield path


def rank0_new(c: CheckpointDir) -> None:
    with _rank0(c, 3, metadata={"via": "rank0"}, aliases=("b",)) as p:
        _write(p, B)


def apply_rank0_new(m: RootModel) -> None:
    m.legacy.pop(3, None)
    m.steps[3] = Saved.of(B, {"via": "rank0"})
    m.point(["b"], ("step", 3), replace=False)


def rank0_named(c: CheckpointDir) -> None:
    with _rank0(c, "interrupted") as p:
        _write(p, A)


def apply_rank0_named(m: RootModel) -> None:
    m.named["interrupted"] = Saved.of(A)


def rank0_join(c: CheckpointDir) -> None:
    """A rank0_commit joined by a nested one (a save_checkpoint() inside the trainer's)."""
    with _rank0(c, 3) as p:
        _write(p, A)
        with _rank0(c, 3, join=True, metadata={"part": 1}) as q:
            _write(q, PART)


def apply_rank0_join(m: RootModel) -> None:
    m.legacy.pop(3, None)
    m.steps[3] = Saved.of({**A, **PART}, {"part": 1})


def rank0_raises(c: CheckpointDir) -> None:
    with _rank0(c, 3) as p:
        _write(p, A)
        raise Boom("rank 0's save failed")


# ---- carried files (Commit.carry, commit(carry=...))


def _carried(m: RootModel, source: Saved, rel: str) -> dict[str, bytes]:
    """The files of ``source`` at ``rel`` (a file, or a directory with a trailing ``/``)."""
    got = {k: v for k, v in source.files if k == rel or k.startswith(rel)}
    if not got:
        raise Refused(CheckpointNotFoundError, f"nothing at {rel} to carry")
    return got


def carry_step(c: CheckpointDir) -> None:
    """Carry step 1's model.bin into a new step 3 (the carried file must stay whole)."""
    with c.commit(3, carry={CARRY_SOURCE: 1}) as p:
        _write(p, PART)


def apply_carry_step(m: RootModel) -> None:
    files = _carried(m, m.require_step(1), CARRY_SOURCE)
    m.legacy.pop(3, None)
    m.steps[3] = Saved.of({**files, **PART})


def carry_named(c: CheckpointDir) -> None:
    """Carry the subtree extra/ of the named checkpoint into a new step 3 (Commit.carry)."""
    handle = c.begin(3)
    try:
        handle.carry("extra/", from_="interrupted")
        _write(handle.path, PART)
    except BaseException as exc:
        handle.abort(exc)
        raise
    handle.publish()


def apply_carry_named(m: RootModel) -> None:
    if "interrupted" not in m.named:
        raise Refused(CheckpointNotFoundError, "no named checkpoint interrupted")
    files = _carried(m, m.named["interrupted"], "extra/")
    m.legacy.pop(3, None)
    m.steps[3] = Saved.of({**files, **PART})


def carry_changed(c: CheckpointDir) -> None:
    """Step 1's model.bin is written in place (same size, new bytes), then carried: the
    carry must notice (VerificationError, nothing committed); the bytes are put back."""
    source = c.path_of(1) / CARRY_SOURCE
    original = source.read_bytes() if source.is_file() else None
    if original is not None:
        with open(source, "r+b") as f:
            f.write(bytes(255 - b for b in original))
    try:
        with c.commit(3, carry={CARRY_SOURCE: 1}) as p:
            _write(p, PART)
    finally:
        if original is not None:
            with open(source, "r+b") as f:
                f.write(original)


def apply_carry_changed(m: RootModel) -> None:
    _carried(m, m.require_step(1), CARRY_SOURCE)
    raise Refused(VerificationError, "the source changed since its commit")


def carry_raises(c: CheckpointDir) -> None:
    with c.commit(3, carry={CARRY_SOURCE: 1}) as p:
        _write(p, PART)
        raise Boom("the save failed after the carry")


def apply_carry_raises(m: RootModel) -> None:
    _carried(m, m.require_step(1), CARRY_SOURCE)
    raise Refused(Boom, "the block raised")


# ---- a block that raises inside the other saves


def begin_raises(c: CheckpointDir) -> None:
    with c.begin(3) as handle:
        _write(handle.path, B)
        raise Boom("the begin block failed")


def begin_named_raises(c: CheckpointDir) -> None:
    with c.begin_named("interrupted") as handle:
        _write(handle.path, A)
        raise Boom("the named begin block failed")


def async_raises(c: CheckpointDir) -> None:
    committer = AsyncCommitter(c)
    try:

        def save(d: Path) -> None:
            _write(Path(d), B)
            raise Boom("the background save failed")

        committer.save(3, save)
    finally:
        committer.close()


def atomic_write_raises(c: CheckpointDir) -> None:
    with atomic_write(c.root.parent / NOTES) as tmp:
        tmp.write_bytes(b'{"epoch": 4}')
        raise Boom("the write failed")


def refuse(exc: type[BaseException], why: str) -> Apply:
    def apply(m: RootModel) -> None:
        raise Refused(exc, why)

    return apply


PARTS: Mapping[str, tuple[Run, Apply]] = {
    "join_options": (join_options, apply_join_options),
    "join_conflict": (join_conflict, refuse(ValueError, "a joined block contradicts")),
    "join_retain_conflict": (
        join_retain_conflict,
        refuse(ValueError, "a joined block's retain contradicts the commit's"),
    ),
    "join_replace_aliases": (join_replace_aliases, apply_join_replace_aliases),
    "join_alone": (join_alone, apply_join_alone),
    "join_named_alone": (join_named_alone, apply_join_named_alone),
    "named_own_alias": (named_own_alias, refuse(ValueError, "alias is its own name")),
    "rank0_commit": (rank0_new, apply_rank0_new),
    "rank0_named": (rank0_named, apply_rank0_named),
    "rank0_join": (rank0_join, apply_rank0_join),
    "rank0_raises": (rank0_raises, refuse(Boom, "the block raised")),
    "carry_step": (carry_step, apply_carry_step),
    "carry_named": (carry_named, apply_carry_named),
    "carry_changed": (carry_changed, apply_carry_changed),
    "carry_raises": (carry_raises, apply_carry_raises),
    "begin_raises": (begin_raises, refuse(Boom, "the block raised")),
    "begin_named_raises": (begin_named_raises, refuse(Boom, "the block raised")),
    "async_save_raises": (async_raises, refuse(Boom, "the background save raised")),
    "atomic_write_raises": (atomic_write_raises, refuse(Boom, "the block raised")),
}
"""The actions of this module by name."""

MULTI: Mapping[str, tuple[Run, Apply, Apply]] = {
    "join_retain": (join_retain, apply_join_retain, apply_join_retain_commit)
}

"""``join_retain``, added with ``multi`` (a retention deletes steps one by one) and its
first phase as ``midway``: (run, apply, midway)."""

LIVE_ONLY = frozenset({"carry_changed"})
"""Checked live only (``Action.crash`` False): a crash between its write into step 1 and
the write putting the bytes back would show a step the user changed, not a defect."""
