"""The alphabet of the model check: every action of :mod:`atomic_ckpt.testing.actions`,
:mod:`atomic_ckpt.testing.parts`, :mod:`atomic_ckpt.testing.edges` and
:mod:`atomic_ckpt.testing.races` by name, the ones
left out until a defect is fixed, and the starting roots."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass

from atomic_ckpt import CheckpointDir, CommitStateError, StepConflictError
from atomic_ckpt.testing.actions import (
    LEGACY,
    A,
    Action,
    B,
    Boom,
    _amend_files,
    _amend_meta,
    _amend_raises,
    _apply_amend_files,
    _apply_amend_meta,
    _apply_amend_raises,
    _apply_atomic_write,
    _apply_commit3b,
    _apply_delete,
    _apply_delete_named,
    _apply_joined,
    _apply_mark,
    _apply_named,
    _apply_promote,
    _apply_remove_alias,
    _apply_retain,
    _apply_set_best,
    _async_save,
    _atomic_write,
    _begin_abort,
    _begin_named,
    _begin_publish,
    _commit,
    _commit_raises,
    _join_nested,
    _join_raises,
    _join_same_thread,
    _join_thread,
    _named,
    _named_raises,
    _refuse,
    _unchanged,
    _write,
)
from atomic_ckpt.testing.edges import EDGES, LIVE_EDGES, MULTI_EDGES
from atomic_ckpt.testing.model import RootModel, files_of
from atomic_ckpt.testing.parts import LIVE_ONLY, MULTI, PARTS
from atomic_ckpt.testing.races import RACES

__all__ = [
    "ACTIONS",
    "ALPHABET",
    "EXCLUDED",
    "LEFTOVERS",
    "LEFTOVER_ACTIONS",
    "ROOTS",
    "Root",
    "by_name",
]


def _alias_on_named(c: CheckpointDir) -> None:
    """A named checkpoint ``taken``, then ``commit(3, aliases=["taken"])``, which must be
    refused up front (StepConflictError, nothing staged): an alias never replaces a real
    entry. (The name is this action's own, so no other action's name is ever an alias.)"""
    with c.commit_named("taken") as p:
        _write(p, A)
    try:
        with c.commit(3, aliases=("taken",)) as p:
            _write(p, B)
    except StepConflictError:
        return
    raise AssertionError("commit(3, aliases=['taken']) over a named checkpoint was not refused")


def _actions() -> tuple[Action, ...]:
    out: list[Action] = []

    def add(
        name: str,
        run: Callable[[CheckpointDir], object],
        apply: Callable[[RootModel], None],
        multi: bool = False,
        lingers: tuple[str, ...] = (),
        *,
        crash: bool = True,
        midway: Callable[[RootModel], None] | None = None,
    ) -> None:
        out.append(Action(name, run, apply, multi, lingers, crash=crash, midway=midway))

    for name, step, files, kw in (
        ("commit_new", 3, A, {}),
        ("commit_replace", 1, B, {}),
        ("commit_legacy", 7, A, {}),
        ("commit_metadata", 3, A, {"metadata": {"loss": 0.5}}),
        ("commit_alias", 3, A, {"aliases": ("b",)}),
        ("commit_alias_taken", 1, A, {"aliases": ("a",)}),
        ("commit_replace_aliases", 2, A, {"aliases": ("b",), "replace_aliases": True}),
    ):
        add(name, *_commit(step, files, **kw))
    add("commit_alias_on_named", _alias_on_named, _apply_named("taken", A))
    add("commit_retain", *_commit(3, A, keep_last=1), multi=True, midway=_commit(3, A)[1])
    add("commit_raises", _commit_raises, _refuse(Boom, "the block raised"))
    add("begin_publish", _begin_publish, _commit(3, B, metadata={"via": "begin"})[1])
    add("begin_abort", _begin_abort, _unchanged)
    add("commit_named", _named("interrupted", A), _apply_named("interrupted", A))
    add("commit_named_raises", _named_raises, _refuse(Boom, "the block raised"))
    add("begin_named", _begin_named, _apply_named("interrupted", B))
    add("join_same_thread", _join_same_thread, _apply_joined)
    add("join_nested", _join_nested, _apply_joined)
    add("join_thread", _join_thread, _apply_joined)
    add("join_raises", _join_raises, _refuse(CommitStateError, "a joined block raised"))
    add("amend_files", _amend_files, _apply_amend_files)
    add("amend_metadata", _amend_meta, _apply_amend_meta)
    add("amend_raises", _amend_raises, _apply_amend_raises)
    promoted = ("named:interrupted",)
    add(
        "promote_named",
        lambda c: c.promote_named("interrupted", 1),
        _apply_promote,
        False,
        promoted,
    )
    add("set_best", lambda c: c.set_best(1), _apply_set_best(1))
    add("set_best_missing", lambda c: c.set_best(5), _apply_set_best(5))
    add("delete_step", lambda c: c.delete(1), _apply_delete(1))
    add("delete_best", lambda c: c.delete(2), _apply_delete(2))
    add("delete_best_force", lambda c: c.delete(2, force=True), _apply_delete(2, force=True))
    add("delete_named", lambda c: c.delete("interrupted"), _apply_delete_named)
    add("remove_alias", lambda c: c.remove_alias("a"), _apply_remove_alias("a"))
    add("remove_alias_missing", lambda c: c.remove_alias("zz"), _apply_remove_alias("zz"))
    add("prune", lambda c: c.prune(keep_last=1), _apply_retain(1, None), multi=True)
    add(
        "retain",
        lambda c: c.retain(keep_last=1, keep_every=2),
        _apply_retain(1, 2),
        multi=True,
    )
    add("mark_complete", lambda c: c.mark_complete(7), _apply_mark(7, check=True))
    add(
        "mark_complete_unchecked",
        lambda c: c.mark_complete(7, check=False),
        _apply_mark(7, check=False),
    )
    add("clean", lambda c: c.clean(), _unchanged, multi=True)
    add("clean_force", lambda c: c.clean(force=True), _unchanged, multi=True)
    add("atomic_write", _atomic_write, _apply_atomic_write)
    add("async_save", _async_save, _apply_commit3b)
    for name, (run, apply) in PARTS.items():
        add(name, run, apply, crash=name not in LIVE_ONLY)
    for name, (run, apply, midway) in MULTI.items():
        add(name, run, apply, multi=True, midway=midway)
    for name, (run, apply) in EDGES.items():
        add(name, run, apply, crash=name not in LIVE_EDGES)
    for name, (run, apply, phase) in MULTI_EDGES.items():
        add(name, run, apply, multi=True, midway=phase)
    for name, (run, apply, first) in RACES.items():
        add(name, run, apply, midway=first)

    return tuple(out)


ACTIONS: tuple[Action, ...] = _actions()
"""Every action, in a fixed order."""

EXCLUDED: dict[str, str] = {}
"""Actions left out of :data:`ALPHABET` because the documented answer depends on a defect
not fixed yet (each kept as a strict xfail in tests/testing/test_model_check.py)."""

ALPHABET: tuple[Action, ...] = tuple(a for a in ACTIONS if a.name not in EXCLUDED)
"""The actions the exploration runs: :data:`ACTIONS` but the :data:`EXCLUDED` ones."""


def by_name(name: str) -> Action:
    for action in ACTIONS:
        if action.name == name:
            return action
    raise KeyError(name)


@dataclass(frozen=True)
class Root:
    """A starting root: its prefix and the actions (run unrecorded) that make it."""

    name: str
    prefix: str
    setup: tuple[Action, ...]


def _legacy(step: int) -> Action:
    """An unmarked directory of ``step`` holding :data:`LEGACY` (older code's, or a save
    killed before its marker)."""

    def run(c: CheckpointDir) -> None:
        c.root.mkdir(parents=True, exist_ok=True)
        path = c.path_of(step)
        path.mkdir()
        _write(path, LEGACY)

    def apply(m: RootModel) -> None:
        m.legacy[step] = files_of(LEGACY)

    return Action(f"setup_legacy_{step}", run, apply)


NAMED_META = {"epoch": 1}
"""The prefixed root's named checkpoint's metadata (a promotion must keep it)."""

_TWO = (
    Action("setup_1", *_commit(1, A)),
    Action("setup_2", *_commit(2, B, metadata={"loss": 0.5}, aliases=("a",))),
    Action("setup_best", lambda c: c.set_best(2), _apply_set_best(2)),
)

ROOTS: tuple[Root, ...] = (
    Root("empty", "", ()),
    Root("two", "", _TWO),
    Root("legacy", "", (_legacy(7),)),
    Root(
        "prefixed",
        "checkpoint-",
        (
            *_TWO[:1],
            Action(
                "setup_named",
                _named("interrupted", B, metadata=NAMED_META, aliases=("b",)),
                _apply_named("interrupted", B, metadata=NAMED_META, aliases=("b",)),
            ),
        ),
    ),
    Root("mixed", "", (_legacy(1), Action("setup_2", *_commit(2, B)))),
)
"""The starting roots: empty; two committed steps with an alias and a best pointer; a
legacy unmarked directory; a prefixed root with a step and a named checkpoint (with
metadata and alias ``b``, which a promotion must carry to the step); an
unmarked step 1 below a complete step 2 (what retention and the best pointer must not
take for a checkpoint)."""


def _leftovers(c: CheckpointDir) -> None:
    """What killed writers leave beside the checkpoints: a staging dir of step 3 with half
    a save and its (unheld) lock file, and the old copy of step 1 that a fallback replace
    (no RENAME_EXCHANGE) killed after its promotion left aside (its staging dir is gone,
    so it is garbage, never to be restored)."""
    from atomic_ckpt._core.l1_names.names import TAG_OLD, lock_name, tmp_name

    staging = c.root / tmp_name("3", "a" * 32, hidden=False)
    staging.mkdir()
    _write(staging, {"model.bin": A["model.bin"]})
    (c.root / lock_name("3", "a" * 32, hidden=False)).write_bytes(b"")
    aside = c.root / tmp_name("1", "b" * 32, TAG_OLD, hidden=False)
    os.mkdir(aside)
    for entry in os.listdir(c.path_of(1)):
        shutil.copy2(c.path_of(1) / entry, aside / entry)


LEFTOVERS = Root(
    "leftovers",
    "",
    (
        *_TWO,
        Action("setup_alias_1", *_commit(1, A, aliases=("c",))),
        Action("setup_leftovers", _leftovers, _unchanged),
    ),
)
"""The ``two`` root, step 1 with alias ``c`` (a step retention deletes with its alias),
with a killed commit's staging dir and lock file and a fallback replace's garbage old
copy beside it: what ``clean()`` has to remove (only the :data:`LEFTOVER_ACTIONS` run
from it, to keep the default run's cost)."""

LEFTOVER_ACTIONS = ("clean", "clean_force", "commit_new", "prune")
"""The actions run from :data:`LEFTOVERS`: the cleanups, and a commit and a retention
that must leave another writer's leftovers alone."""
