"""The action alphabet of the model check: every mutating public operation as a pair
(run it on a :class:`~atomic_ckpt.CheckpointDir`, apply it to a
:class:`~atomic_ckpt.testing.model.RootModel`).

A user adds an action by making an :class:`Action` (a name, ``run`` and ``apply``) and
passing it to :func:`~atomic_ckpt.testing.sequences.check_sequence` with the others.
The alphabet is small on purpose: steps 1 and 2 (present in the ``two`` root), 3 (new)
and 7 (an unmarked legacy directory), the name ``interrupted``, the aliases ``a`` (on
step 2 in the ``two`` root) and ``b``, and two contents ``A`` and ``B`` (``B``
replaces ``A``'s ``model.bin`` and adds ``extra/opt.bin``): replacements, collisions
and refusals all occur.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from atomic_ckpt import (
    AsyncCommitter,
    CheckpointDir,
    CheckpointNotFoundError,
    StepConflictError,
    VerificationError,
    atomic_write,
)
from atomic_ckpt.testing.model import Refused, RootModel, Saved

__all__ = ["LEGACY", "PART", "A", "Action", "B", "Boom"]

A: dict[str, bytes] = {"model.bin": b"A" * 40}
B: dict[str, bytes] = {"model.bin": b"B" * 33, "extra/opt.bin": b"b" * 20}
LEGACY: dict[str, bytes] = {"model.bin": b"L" * 30, "config.json": b"{broken"}
PART: dict[str, bytes] = {"part1.bin": b"P" * 16}
NOTES = "notes.json"


class Boom(RuntimeError):
    """The error a block raises inside an action (``*_raises`` actions)."""


def _write(path: Path, files: Mapping[str, bytes]) -> None:
    for rel, data in sorted(files.items()):
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_bytes(data)


@dataclass(frozen=True)
class Action:
    """One public operation: ``run`` does it, ``apply`` is its model transition (it
    mutates the model it is given, or raises :class:`Refused` before changing anything).

    ``multi``: it changes several independent entries one by one (deletions of a
    retention, a clean), so a crash may leave any mix of before and after per entry;
    otherwise the steps and named checkpoints it changes move together.
    """

    name: str
    run: Callable[[CheckpointDir], object]
    apply: Callable[[RootModel], None]
    multi: bool = False
    lingers: tuple[str, ...] = ()
    """Observation keys that may still show their old value once the rest is new (the
    named checkpoint a promotion copied, removed after the step is in place); never the
    other way round."""
    crash: bool = True
    """False: its crash states are not explored, only its live outcome checked (its run
    changes a committed file itself and puts it back, which a crash between would show:
    the user's doing, not the library's)."""
    midway: Callable[[RootModel], None] | None = None
    """The transition of its first phase, where it has one that a crash may show on its
    own: a commit with ``retain=`` publishes its checkpoint before the retention deletes
    any (even, where a higher step is kept, that checkpoint itself). Each entry of a
    crash state may then also be as after ``midway``."""


# ---- commits


def _commit(
    step: int,
    files: Mapping[str, bytes],
    *,
    metadata: Mapping[str, Any] | None = None,
    aliases: tuple[str, ...] = (),
    replace_aliases: bool = False,
    keep_last: int | None = None,
) -> tuple[Callable[[CheckpointDir], object], Callable[[RootModel], None]]:
    def run(c: CheckpointDir) -> None:
        from atomic_ckpt import RetentionPolicy

        retain = RetentionPolicy.last(keep_last) if keep_last else None
        with c.commit(
            step,
            metadata=metadata,
            aliases=aliases,
            replace_aliases=replace_aliases,
            retain=retain,
        ) as p:
            _write(p, files)

    def apply(m: RootModel) -> None:
        m.legacy.pop(step, None)  # an unmarked directory is replaced (with a warning)
        m.steps[step] = Saved.of(files, metadata)
        m.point(list(aliases), ("step", step), replace=replace_aliases)
        if keep_last:
            m.retain(keep_last=keep_last)

    return run, apply


def _commit_raises(c: CheckpointDir) -> None:
    with c.commit(3) as p:
        _write(p, A)
        raise Boom("the save failed half-way")


def _refuse(exc: type[BaseException], why: str) -> Callable[[RootModel], None]:
    def apply(m: RootModel) -> None:
        raise Refused(exc, why)

    return apply


def _unchanged(m: RootModel) -> None:
    """A transition that changes nothing observable."""


def _begin_publish(c: CheckpointDir) -> None:
    handle = c.begin(3, metadata={"via": "begin"})
    _write(handle.path, B)
    handle.publish()


def _begin_abort(c: CheckpointDir) -> None:
    handle = c.begin(3)
    _write(handle.path, B)
    handle.abort()


def _named(
    name: str,
    files: Mapping[str, bytes],
    *,
    metadata: Mapping[str, Any] | None = None,
    aliases: tuple[str, ...] = (),
) -> Callable[[CheckpointDir], object]:
    def run(c: CheckpointDir) -> None:
        with c.commit_named(name, metadata=metadata, aliases=aliases) as p:
            _write(p, files)

    return run


def _apply_named(
    name: str,
    files: Mapping[str, bytes],
    *,
    metadata: Mapping[str, Any] | None = None,
    aliases: tuple[str, ...] = (),
) -> Callable[[RootModel], None]:
    def apply(m: RootModel) -> None:
        m.named[name] = Saved.of(files, metadata)
        m.point(list(aliases), ("named", name), replace=False)

    return apply


def _named_raises(c: CheckpointDir) -> None:
    with c.commit_named("interrupted") as p:
        _write(p, A)
        raise Boom("the named save failed")


def _begin_named(c: CheckpointDir) -> None:
    handle = c.begin_named("interrupted")
    _write(handle.path, B)
    handle.finish()


def _join_same_thread(c: CheckpointDir) -> None:
    with c.commit(3) as p:
        _write(p, A)
        with c.commit(3, join=True) as q:
            _write(q, PART)


def _join_nested(c: CheckpointDir) -> None:
    with c.commit(3) as p:
        _write(p, A)
        with c.commit(3, join=True), c.commit(3, join=True) as q:
            _write(q, PART)


def _join_thread(c: CheckpointDir) -> None:
    """A joined block in another thread, still writing when the outer block ends: the
    publish must wait for it (PROTOCOL.md: no publish while a joined block is open)."""
    entered = threading.Event()

    def part() -> None:
        with c.commit(3, join=True) as q:
            entered.set()
            time.sleep(0.05)
            _write(q, PART)

    with c.commit(3) as p:
        _write(p, A)
        worker = threading.Thread(target=part)
        worker.start()
        entered.wait(5)
    worker.join()


def _join_raises(c: CheckpointDir) -> None:
    """A joined block raises, its caller swallows the error: the outer commit must not
    publish (CommitStateError), never a published half."""
    with c.commit(3) as p:
        _write(p, A)
        try:
            with c.commit(3, join=True) as q:
                _write(q, PART)
                raise Boom("a part failed")
        except Boom:
            pass


def _apply_joined(m: RootModel) -> None:
    m.steps[3] = Saved.of({**A, **PART})


# ---- amend


def _amend_files(c: CheckpointDir) -> None:
    with c.amend(2, remove=["extra"], metadata={"amended": 1}) as p:
        _write(p, {"model.bin": b"N" * 12, "new.bin": b"n" * 9})


def _apply_amend_files(m: RootModel) -> None:
    old = m.require_step(2)
    files = {k: v for k, v in old.files if not k.startswith("extra/")}
    files.update({"model.bin": b"N" * 12, "new.bin": b"n" * 9})
    m.steps[2] = Saved.of(files, {**old.meta(), "amended": 1})


def _amend_meta(c: CheckpointDir) -> None:
    """Metadata only, on step 2 (which has metadata of its own: the two merge)."""
    with c.amend(2, metadata={"lr": 0.25}):
        pass


def _apply_amend_meta(m: RootModel) -> None:
    old = m.require_step(2)
    m.steps[2] = Saved(old.files, Saved.of({}, {**old.meta(), "lr": 0.25}).metadata)


def _amend_raises(c: CheckpointDir) -> None:
    with c.amend(1) as p:
        _write(p, B)
        raise Boom("the amend failed")


def _apply_amend_raises(m: RootModel) -> None:
    m.require_step(1)
    raise Refused(Boom, "the block raised")


# ---- named, best, delete, aliases, retention


def _apply_promote(m: RootModel) -> None:
    if "interrupted" not in m.named:
        raise Refused(CheckpointNotFoundError, "no named checkpoint interrupted")
    m.legacy.pop(1, None)
    m.steps[1] = m.named.pop("interrupted")  # its metadata too
    for alias in m.aliases_of(("named", "interrupted")):  # its aliases follow it
        m.aliases[alias] = ("step", 1)


def _apply_set_best(step: int) -> Callable[[RootModel], None]:
    def apply(m: RootModel) -> None:
        m.require_step(step)
        m.best = step

    return apply


def _apply_delete(step: int, *, force: bool = False) -> Callable[[RootModel], None]:
    def apply(m: RootModel) -> None:
        m.require_step(step)
        if m.best == step and not force:
            raise Refused(StepConflictError, f"step {step} is the best")
        m.delete_step(step)

    return apply


def _apply_delete_named(m: RootModel) -> None:
    if "interrupted" not in m.named:
        raise Refused(CheckpointNotFoundError, "no named checkpoint interrupted")
    del m.named["interrupted"]
    m.drop_target(("named", "interrupted"))


def _apply_remove_alias(alias: str) -> Callable[[RootModel], None]:
    def apply(m: RootModel) -> None:
        if alias not in m.aliases:
            raise Refused(CheckpointNotFoundError, f"no alias {alias}")
        del m.aliases[alias]

    return apply


def _apply_retain(keep_last: int | None, keep_every: int | None) -> Callable[[RootModel], None]:
    def apply(m: RootModel) -> None:
        m.retain(keep_last=keep_last, keep_every=keep_every)

    return apply


def _apply_mark(step: int, *, check: bool) -> Callable[[RootModel], None]:
    def apply(m: RootModel) -> None:
        if step in m.steps:
            return  # already complete: returned unchanged
        if step not in m.legacy:
            raise Refused(CheckpointNotFoundError, f"no directory for step {step}")
        if check and any(k.endswith(".json") and v == b"{broken" for k, v in m.legacy[step]):
            raise Refused(VerificationError, "config.json does not parse")
        m.steps[step] = Saved.of(dict(m.legacy.pop(step)), {"adopted": True})

    return apply


def _atomic_write(c: CheckpointDir) -> None:
    with atomic_write(c.root.parent / NOTES) as tmp:
        tmp.write_bytes(b'{"epoch": 3}')


def _apply_atomic_write(m: RootModel) -> None:
    m.files[NOTES] = b'{"epoch": 3}'


def _async_save(c: CheckpointDir) -> None:
    committer = AsyncCommitter(c)
    try:
        committer.save(3, lambda d: _write(Path(d), B))
    finally:
        committer.close()


def _apply_commit3b(m: RootModel) -> None:
    m.steps[3] = Saved.of(B)
