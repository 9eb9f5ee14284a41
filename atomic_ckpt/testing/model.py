"""The reference model of a checkpoint root: what every query must answer, in pure Python.

A :class:`RootModel` is the observable state of a root: its complete steps (exact
files and manifest metadata), its named checkpoints, its aliases (and what each
names), the ``checkpoint_best`` pointer, the unmarked (legacy) step directories,
and the plain files :func:`~atomic_ckpt.atomic_write` put beside it. Each action of
:mod:`atomic_ckpt.testing.actions` is a transition of it; a refusal raises
:class:`Refused` (naming the exception the library must raise) and leaves the model
as it was. :func:`observe` reads the same state off a real root through the public
API, so model and root compare with ``==``.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

from atomic_ckpt import BEST_LINK, CheckpointDir, CheckpointError, parse_step
from atomic_ckpt.testing._recorder import read_tree

__all__ = ["Observation", "Refused", "RootModel", "Saved", "Target", "observe"]

Files: TypeAlias = tuple[tuple[str, bytes], ...]
"""A checkpoint's regular files (path relative to it, contents), sorted by path."""

Target: TypeAlias = tuple[str, int | str]
"""What an alias names: ``("step", 3)`` or ``("named", "interrupted")``."""

Observation: TypeAlias = dict[str, object]
"""A root's observable state as flat keys: ``step:N``, ``named:X``, ``legacy:N``,
``alias:A``, ``best``, ``file:F``; a key is absent when the entry is."""


def files_of(files: Mapping[str, bytes]) -> Files:
    return tuple(sorted(files.items()))


@dataclass(frozen=True)
class Saved:
    """One complete checkpoint's contents: its files and its manifest metadata (as JSON)."""

    files: Files
    metadata: str = "{}"

    @staticmethod
    def of(files: Mapping[str, bytes], metadata: Mapping[str, Any] | None = None) -> Saved:
        return Saved(files_of(files), json.dumps(dict(metadata or {}), sort_keys=True))

    def meta(self) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(self.metadata)
        return out


class Refused(Exception):
    """A transition the library must refuse with ``expected`` (model unchanged); ``says``,
    where given, a phrase its message must contain (the cause or the remedy it names)."""

    def __init__(self, expected: type[BaseException], why: str, *, says: str | None = None) -> None:
        super().__init__(f"{expected.__name__}: {why}")
        self.expected = expected
        self.why = why
        self.says = says


@dataclass
class RootModel:
    """The observable state of one checkpoint root; transitions return a new model."""

    prefix: str = ""
    steps: dict[int, Saved] = field(default_factory=dict)
    named: dict[str, Saved] = field(default_factory=dict)
    aliases: dict[str, Target] = field(default_factory=dict)
    best: int | None = None
    legacy: dict[int, Files] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)

    def copy(self) -> RootModel:
        return copy.deepcopy(self)

    # ---- the queries, as the public API must answer them

    def latest(self) -> int | None:
        return max(self.steps, default=None)

    def aliases_of(self, target: Target) -> list[str]:
        return sorted(a for a, t in self.aliases.items() if t == target)

    def observation(self) -> Observation:
        out: Observation = {}
        out.update({f"step:{s}": v for s, v in self.steps.items()})
        out.update({f"named:{n}": v for n, v in self.named.items()})
        out.update({f"legacy:{s}": v for s, v in self.legacy.items()})
        out.update({f"alias:{a}": t for a, t in self.aliases.items()})
        out.update({f"file:{f}": v for f, v in self.files.items()})
        if self.best is not None:
            out["best"] = self.best
        return out

    # ---- transition helpers, shared by the actions

    def require_step(self, step: int) -> Saved:
        from atomic_ckpt import CheckpointNotFoundError

        if step not in self.steps:
            raise Refused(CheckpointNotFoundError, f"no complete step {step}")
        return self.steps[step]

    def drop_target(self, target: Target) -> None:
        """A checkpoint goes: its aliases go with it."""
        for alias in self.aliases_of(target):
            del self.aliases[alias]

    def delete_step(self, step: int) -> None:
        del self.steps[step]
        self.drop_target(("step", step))
        if self.best == step:
            self.best = None

    def retain(
        self,
        keep_last: int | None = None,
        keep_every: int | None = None,
    ) -> None:
        """RetentionPolicy: keep the last ``keep_last``, every multiple of ``keep_every``,
        always the latest and the best; delete the rest."""
        ordered = sorted(self.steps)
        keep = set(ordered[-keep_last:] if keep_last else ())
        if keep_every:
            keep |= {s for s in ordered if s % keep_every == 0}
        if ordered:
            keep.add(ordered[-1])
        if self.best is not None:
            keep.add(self.best)
        for step in ordered:
            if step not in keep:
                self.delete_step(step)

    def point(self, aliases: list[str], target: Target, *, replace: bool) -> None:
        if replace:
            for alias in self.aliases_of(target):
                if alias not in aliases:
                    del self.aliases[alias]
        for alias in aliases:
            self.aliases[alias] = target


def _files_of_dir(path: Path) -> Files:
    tree = read_tree(path)
    return files_of(tree.files)


def observe(root: Path, *, prefix: str = "") -> Observation:
    """The observable state of the root at ``root`` as a :class:`RootModel` would state it,
    read through the public API (``checkpoints()``, ``named()``, ``best()``,
    ``entries()``; aliases and the files beside the root read off the directory).

    Raises ``AssertionError`` where the root breaks a promise no model state could
    describe: a complete step that does not verify, a dangling alias or best pointer,
    ``checkpoints()`` or ``steps()`` not in ascending order.
    """
    out: Observation = {}
    parent = root.parent
    if parent.is_dir():
        for name in sorted(os.listdir(parent)):
            if name.endswith(".json") and (parent / name).is_file():
                out[f"file:{name}"] = (parent / name).read_bytes()
    if not root.is_dir():
        return out
    ckpts = CheckpointDir(root, prefix=prefix, durable=False, workers=1)
    found = ckpts.checkpoints()
    order = [c.step for c in found]
    if order != sorted(order) or ckpts.steps() != sorted(order):
        raise AssertionError(f"checkpoints() {order} and steps() {ckpts.steps()} not ascending")
    for c in found:
        try:
            ckpts.verify(c.step)
        except CheckpointError as exc:
            raise AssertionError(f"complete step {c.step} does not verify: {exc}") from None
        out[f"step:{c.step}"] = Saved(
            _files_of_dir(c.path), json.dumps(dict(c.manifest.metadata or {}), sort_keys=True)
        )
    for n in ckpts.named():
        out[f"named:{n.name}"] = Saved(
            _files_of_dir(n.path), json.dumps(dict(n.manifest.metadata or {}), sort_keys=True)
        )
    for e in ckpts.entries():
        if e.status == "unmarked" and e.step is not None:
            out[f"legacy:{e.step}"] = _files_of_dir(e.path)
    best = ckpts.best()
    if best is not None:
        out["best"] = best.step
    elif os.path.lexists(root / BEST_LINK):
        pointer = root / BEST_LINK  # a symlink, or a file where symlinks are refused
        named = os.readlink(pointer) if pointer.is_symlink() else "(a file naming it)"
        raise AssertionError(f"{BEST_LINK} -> {named} dangles")
    for name in sorted(os.listdir(root)):
        path = root / name
        if name == BEST_LINK or not path.is_symlink() or ".tmp-" in name:
            continue
        link = os.readlink(path)
        step = parse_step(link, prefix)
        target: Target = ("step", step) if step is not None else ("named", link)
        key = f"step:{step}" if step is not None else f"named:{link}"
        if key not in out:
            raise AssertionError(f"alias {name} -> {link} dangles")
        out[f"alias:{name}"] = target
    return out
