"""Retention: which complete checkpoints to keep, and the ``checkpoint_best`` pointer.

A :class:`RetentionPolicy` keeps the union of its rules (the last ``k``, every
``n``-th step, the best ``k`` by a metric recorded in the manifest metadata)
and always the latest checkpoint and the one ``checkpoint_best`` names. It is
applied after a commit has returned, i.e. once the new checkpoint is durable.

Order, so a crash anywhere leaves the pointer naming a complete checkpoint:
first the pointer moves (a temporary symlink renamed over it, then the root is
fsynced), then the checkpoints it no longer protects are deleted, each moved
out of sight durably before it is removed (``CheckpointDir._delete``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from . import _fs
from ._errors import CheckpointNotFoundError
from ._names import BEST_LINK, new_token, parse_step, tmp_name
from ._scan import Checkpoint

if TYPE_CHECKING:
    from ._checkpoint import CheckpointDir

log = logging.getLogger("atomic_ckpt")

Mode = Literal["min", "max"]


def _positive(name: str, value: int | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1 or None, got {value!r}")


@dataclass(frozen=True)
class RetentionPolicy:
    """Which complete checkpoints to keep; every other one is deleted by :meth:`apply`.

    * ``keep_last``: the ``k`` newest steps.
    * ``keep_every``: every step divisible by ``n`` (e.g. 1000: a long-term history).
    * ``keep_best``: the ``k`` best by ``metric`` (a number stored with
      ``commit(step, metadata={metric: value})``), smallest first with
      ``mode="min"``, largest with ``"max"``; on a tie the newer step wins.
      Giving ``metric`` alone means ``keep_best=1``. With a metric, ``apply``
      also points the ``checkpoint_best`` symlink at the best one.

    The latest checkpoint and the one ``checkpoint_best`` names are always kept.
    Checkpoints whose metadata lacks the metric (or holds a non-finite or
    non-numeric value) are never "best"; the other rules still apply to them.
    """

    keep_last: int | None = None
    keep_every: int | None = None
    keep_best: int | None = None
    metric: str | None = None
    mode: Mode = "min"

    def __post_init__(self) -> None:
        _positive("keep_last", self.keep_last)
        _positive("keep_every", self.keep_every)
        _positive("keep_best", self.keep_best)
        if self.mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {self.mode!r}")
        if self.metric is not None and (not isinstance(self.metric, str) or not self.metric):
            raise ValueError(f"metric must be a non-empty metadata key, got {self.metric!r}")
        if self.keep_best is not None and self.metric is None:
            raise ValueError("keep_best needs metric= (the metadata key to rank by)")
        if self.keep_last is None and self.keep_every is None and self.metric is None:
            raise ValueError(
                "a retention policy needs at least one of keep_last, keep_every, metric"
            )

    def value(self, ckpt: Checkpoint) -> float | None:
        """``ckpt``'s metric as a finite float, or None if it has none."""
        if self.metric is None:
            return None
        raw = ckpt.manifest.metadata.get(self.metric)
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            return None
        value = float(raw)
        return value if math.isfinite(value) else None

    def plan(self, found: Sequence[Checkpoint], *, protect: int | None = None) -> Plan:
        """Split ``found`` (ascending by step) into kept and deleted; never deletes
        the latest, the best or ``protect`` (the step ``checkpoint_best`` names)."""
        if not found:
            return Plan(keep=[], delete=[], best=None)
        steps = [c.step for c in found]
        keep = {steps[-1]}
        if protect is not None:
            keep.add(protect)
        if self.keep_last is not None:
            keep.update(steps[-self.keep_last :])
        if self.keep_every is not None:
            keep.update(s for s in steps if s % self.keep_every == 0)
        best: Checkpoint | None = None
        if self.metric is not None:
            sign = 1.0 if self.mode == "min" else -1.0
            scored = [(v, c) for c in found if (v := self.value(c)) is not None]
            scored.sort(key=lambda vc: (sign * vc[0], -vc[1].step))
            ranked = [c for _, c in scored]
            keep.update(c.step for c in ranked[: self.keep_best or 1])
            best = ranked[0] if ranked else None
        return Plan(
            keep=[c for c in found if c.step in keep],
            delete=[c for c in found if c.step not in keep],
            best=best,
        )

    def apply(self, ckpts: CheckpointDir) -> list[Path]:
        """Move the best pointer (durably), then delete what the policy does not keep.

        Returns the deleted paths. Call it after a commit has returned (in a
        multi-rank job, on rank 0 only: ``distributed_commit(retain=...)`` does).
        """
        found = ckpts.checkpoints()
        current = _link_step(ckpts)
        plan = self.plan(found, protect=current)
        if plan.best is not None and plan.best.step != current:
            set_best(ckpts, plan.best.step)
            # The old target is protected no longer; plan again without it.
            plan = self.plan(found, protect=plan.best.step)
        return ckpts._delete([c.path for c in plan.delete])


@dataclass(frozen=True)
class Plan:
    """What a policy keeps and deletes among the complete checkpoints, and the best one."""

    keep: list[Checkpoint] = field(default_factory=list)
    delete: list[Checkpoint] = field(default_factory=list)
    best: Checkpoint | None = None


def _link_step(ckpts: CheckpointDir) -> int | None:
    """The step ``checkpoint_best`` names, or None (no link, or not a step name)."""
    try:
        target = os.readlink(ckpts.root / BEST_LINK)
    except OSError:  # missing, or not a symlink
        return None
    # A checkpoint root is untrusted input: only a plain sibling name counts.
    if "/" in target or os.sep in target:
        return None
    return parse_step(ckpts.prefix, target)


def read_best(ckpts: CheckpointDir) -> Checkpoint | None:
    """The complete checkpoint ``checkpoint_best`` names, or None."""
    step = _link_step(ckpts)
    if step is None:
        return None
    try:
        return ckpts.get(step)
    except CheckpointNotFoundError as exc:
        log.warning("%s names no complete checkpoint: %s", ckpts.root / BEST_LINK, exc)
        return None


def set_best(ckpts: CheckpointDir, step: int) -> None:
    """Point ``checkpoint_best`` at ``step`` atomically and durably.

    A new symlink under a ``.tmp-`` name (which ``clean()`` removes if we crash)
    is renamed over the old one, under the root lock (so ``clean()`` cannot
    remove the temporary link in between), then the root is fsynced.
    """
    target = ckpts.get(step).path.name  # raises unless step is complete
    link = ckpts.root / BEST_LINK
    tmp = ckpts.root / tmp_name(BEST_LINK, new_token())
    with ckpts._root_lock():
        os.symlink(target, tmp)
        try:
            _fs.rename(tmp, link)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        if ckpts._protocol.fsync_root:
            _fs.fsync_dir(ckpts.root)
