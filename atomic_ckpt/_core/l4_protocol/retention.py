"""Retention as a pure plan: which complete checkpoints a policy keeps, which it deletes.

A :class:`RetentionPolicy` keeps the union of its rules (the last ``k``, every
``n``-th step, the best ``k`` by a metric recorded in the manifest metadata)
and always the latest checkpoint and the one ``checkpoint_best`` names. Its
:meth:`~RetentionPolicy.plan` does no I/O; carrying a plan out (first the best
pointer moves, durably, then the checkpoints it no longer protects are deleted,
each moved out of sight durably before it is removed) is ``_delete.retain``'s
job, under the root lock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from atomic_ckpt._core.l3_formats.read import Checkpoint

Mode = Literal["min", "max"]


def _positive(name: str, value: int | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1 or None, got {value!r}")


@dataclass(frozen=True)
class RetentionPolicy:
    """Which complete checkpoints to keep; ``CheckpointDir.retain(policy)`` deletes the rest.

    * ``keep_last``: the ``k`` newest steps.
    * ``keep_every``: every step divisible by ``n`` (e.g. 1000: a long-term history).
    * ``keep_best``: the ``k`` best by ``metric`` (a number stored with
      ``commit(step, metadata={metric: value})``), smallest first with
      ``mode="min"``, largest with ``"max"``; on a tie the newer step wins.
      Giving ``metric`` alone means ``keep_best=1``. With a metric, retaining
      also points the ``checkpoint_best`` symlink at the best one.

    * ``delete=False``: delete nothing, only point ``checkpoint_best`` at the best
      checkpoint by ``metric`` (a policy that only points).

    The latest checkpoint and the one ``checkpoint_best`` names are always kept.
    Checkpoints whose metadata lacks the metric (or holds a non-finite or
    non-numeric value) are never "best"; the other rules still apply to them.
    """

    keep_last: int | None = None
    keep_every: int | None = None
    keep_best: int | None = None
    metric: str | None = None
    mode: Mode = "min"
    delete: bool = True

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
        if not self.delete and self.metric is None:
            raise ValueError("a policy that deletes nothing (delete=False) needs metric=")
        if self.keep_last is None and self.keep_every is None and self.metric is None:
            raise ValueError(
                "a retention policy needs at least one of keep_last, keep_every, metric"
            )

    @classmethod
    def of(
        cls,
        policy: RetentionPolicy | None = None,
        *,
        keep_last: int | None = None,
        keep_every: int | None = None,
        keep_best: int | None = None,
        metric: str | None = None,
        mode: Mode = "min",
    ) -> RetentionPolicy:
        """``policy``, or one made of these options (``retain()``'s two ways to say it);
        TypeError for both at once."""
        if policy is None:
            return cls(
                keep_last=keep_last,
                keep_every=keep_every,
                keep_best=keep_best,
                metric=metric,
                mode=mode,
            )
        if any(v is not None for v in (keep_last, keep_every, keep_best, metric)):
            raise TypeError("pass a RetentionPolicy or its options, not both")
        return policy

    @classmethod
    def last(cls, keep_last: int) -> RetentionPolicy:
        """Keep the ``keep_last`` newest (``prune()``): an int >= 1, since the latest
        checkpoint is never deleted."""
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
            raise ValueError(
                f"keep_last must be an int >= 1 (the latest checkpoint is never deleted), "
                f"got {keep_last!r}"
            )
        return cls(keep_last=keep_last)

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
            return Plan()
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
        if not self.delete:
            return Plan(best=best)
        return Plan(delete=[c for c in found if c.step not in keep], best=best)


@dataclass(frozen=True)
class Plan:
    """What a policy deletes among the complete checkpoints, and the best one."""

    delete: list[Checkpoint] = field(default_factory=list)
    best: Checkpoint | None = None
