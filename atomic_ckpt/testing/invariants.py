"""The invariants of PROTOCOL.md (I1 to I4), checked on a crash state with the real
scanner and loader: the default checker of :func:`~atomic_ckpt.testing.explore`."""

from __future__ import annotations

import os
from pathlib import Path

from atomic_ckpt import MARKER, TMP_INFIX, CheckpointError, Manifest, parse_step
from atomic_ckpt._core.l1_names.names import step_name
from atomic_ckpt.testing._recorder import _read_marker_bytes, read_tree
from atomic_ckpt.testing._results import CrashState, InvariantViolation

__all__ = ["check_invariants"]


def _complete_by_hand(root: Path, prefix: str) -> list[int]:
    """The complete steps of ``root`` read without the scanner (an independent check of I4)."""
    out: list[int] = []
    if not root.is_dir():
        return out
    for name in os.listdir(root):
        step = parse_step(name, prefix)
        path = root / name
        if step is None or path.is_symlink() or not path.is_dir():
            continue
        marker = path / MARKER
        if marker.is_symlink() or not marker.is_file():
            continue
        try:
            Manifest.from_bytes(marker.read_bytes())
        except CheckpointError:
            continue
        out.append(step)
    return sorted(out)


def _check_once(state: CrashState, when: str, *, window: bool) -> None:
    ckpts = state.checkpoints()
    found = ckpts.checkpoints()
    steps = [c.step for c in found]
    latest = ckpts.latest()
    by_hand = _complete_by_hand(state.root, state.prefix)
    if steps != by_hand:
        raise InvariantViolation(
            "I4", f"{when}the scanner reports steps {steps}, but the complete ones are {by_hand}"
        )
    if (latest.step if latest else None) != (steps[-1] if steps else None):
        raise InvariantViolation(
            "I4",
            f"{when}latest() is {latest and latest.step}, the highest complete step is "
            f"{steps[-1] if steps else None}",
        )
    for c in found:
        if c.path.name != step_name(state.prefix, c.step) or TMP_INFIX in c.path.name:
            raise InvariantViolation("I4", f"{when}{c.path.name} was reported as step {c.step}")
        e = state.expected.get(c.step)
        if e is None:
            raise InvariantViolation("I4", f"{when}step {c.step} is reported but was never saved")
        try:
            ckpts.verify(c.step)
        except CheckpointError as exc:
            raise InvariantViolation(
                "I1", f"{when}step {c.step} is reported complete but does not verify: {exc}"
            ) from None
        tree, marker = read_tree(c.path), _read_marker_bytes(c.path)
        if any(v.matches(tree, marker) for v in e.allowed):
            continue
        if any(v.matches(tree, marker) for v in e.stale):
            old = next(v for v in e.stale if v.matches(tree, marker))
            raise InvariantViolation(
                "I2",
                f"{when}step {c.step} shows {old.label}, older than "
                f"{e.allowed[0].label} which returned before the crash",
            )
        raise InvariantViolation(
            "I1",
            f"{when}step {c.step} holds contents no single save wrote: {tree.summary()}; "
            f"marker {len(marker or b'')} bytes; saves: "
            + "; ".join(f"{v.label}: {v.tree.summary()}" for v in e.allowed + e.stale),
        )
    for step, e in state.expected.items():
        if e.required and step not in steps:
            if e.replacing:
                if not window:
                    raise InvariantViolation(
                        "I3", f"{when}step {step} is missing while it was being replaced"
                    )
            else:
                raise InvariantViolation(
                    "I2",
                    f"{when}step {step} ({e.allowed[0].label}) returned before the crash "
                    "but is not reported",
                )


def check_invariants(state: CrashState, *, recover: bool = True) -> None:
    """Assert I1 to I4 of PROTOCOL.md on a crash state, with the real scanner and loader.

    I1: every step reported complete verifies and holds exactly one save's
    files and marker. I2: a step whose save returned before the crash is
    reported, with its newest returned contents. I3: a step being replaced is
    never missing. I4: ``latest()`` is the highest complete step and only
    canonically named, marked directories count. With ``recover``, ``clean()``
    then runs on the state and everything is checked again (``clean()`` must
    never remove a complete checkpoint, and must close the one window of the
    move-aside replace, where I3 is checked only after it).
    """
    _check_once(state, "", window=state.moved_aside and recover)
    if recover:
        state.checkpoints().clean()
        _check_once(state, "after clean(): ", window=False)
