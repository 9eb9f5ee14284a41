"""Why a resume refuses: the errors :meth:`CheckpointDir.resume_point` raises where the root
holds checkpoints it must not train over (newer ones, moved ones, unmarked ones, ones of
another prefix)."""

from __future__ import annotations

from pathlib import Path

from atomic_ckpt._core.l1_names.errors import (
    NewerCheckpointsError,
    UnmarkedCheckpointsError,
    UnusableCheckpointsError,
)
from atomic_ckpt._core.l1_names.names import MARKER
from atomic_ckpt._core.l3_formats import read as _read
from atomic_ckpt._core.l3_formats.read import Checkpoint, Entry
from atomic_ckpt._core.l4_protocol.root import Root


def other_prefix_error(root: Root) -> UnusableCheckpointsError | None:
    """The refusal to start fresh where the root holds no step directory of this
    prefix but complete checkpoints named with another (``checkpoint-3/`` seen with
    the default prefix): the job would ignore them. None if there are none."""
    others = _read.other_prefixes(root.path, root.prefix)
    if not others:
        return None
    prefixes = sorted({p for _, p, _ in others})
    problems = tuple(
        f"{path}: a complete checkpoint of step {step} under prefix={other!r}"
        for path, other, step in others
    )
    opened = " or ".join(f"prefix={p!r}" for p in prefixes)
    return UnusableCheckpointsError(
        f"{root.path} holds no checkpoint named with this CheckpointDir's "
        f"prefix={root.prefix!r}, but {len(others)} complete checkpoint(s) named "
        "with another prefix:\n  " + "\n  ".join(problems) + "\nStarting from scratch "
        f"would ignore them. Open the root with {opened} to resume from them "
        f"(CheckpointDir(root, {opened.split(' or ')[-1]})); or start the run from "
        "scratch deliberately beside them",
        path=root.path,
        paths=tuple(path for path, _, _ in others),
        problems=problems,
    )


def newer_error(root: Root, found: Checkpoint, newer: list[Entry]) -> NewerCheckpointsError:
    problems = tuple(f"{e.path}: {e.problem}" for e in newer)
    return NewerCheckpointsError(
        f"{root.path} holds {len(newer)} checkpoint(s) newer than step {found.step} that "
        "a newer atomic_ckpt wrote:\n  "
        + "\n  ".join(problems)
        + f"\nResuming from step {found.step} would train over them and replace them. "
        "Upgrade atomic_ckpt (pip install -U atomic_ckpt) to resume from the newest, or "
        "move them out of the root to resume from the older one",
        path=root.path,
        paths=tuple(e.path for e in newer),
        problems=problems,
    )


def moved_error(root: Root, found: Checkpoint, moved: list[Entry]) -> UnusableCheckpointsError:
    problems = tuple(f"{e.path}: {e.problem}" for e in moved)
    what, how = (
        (
            "complete checkpoint(s)",
            "under a name that is not theirs (moved or copied there by hand)",
        )
        if all(e.moved for e in moved)
        else ("step directories", "that cannot be used and are not to be lost")
    )
    return UnusableCheckpointsError(
        f"{root.path} holds {len(moved)} {what} above step {found.step} {how}:\n  "
        + "\n  ".join(problems)
        + f"\nResuming from step {found.step} would skip them and train over them. Do "
        "what each says: move a moved one back to its own name; make a named one a step "
        "with `atomic-ckpt promote ROOT NAME STEP`",
        path=root.path,
        paths=tuple(e.path for e in moved),
        problems=problems,
    )


def unmarked_error(root: Root, unmarked: tuple[Path, ...]) -> UnmarkedCheckpointsError:
    shown = ", ".join(p.name for p in unmarked[:5]) + (", ..." if len(unmarked) > 5 else "")
    return UnmarkedCheckpointsError(
        f"{root.path} holds {len(unmarked)} step directories without a {MARKER} "
        f"marker ({shown}) and no complete checkpoint. If they were written "
        f"completely, adopt them (each one): `atomic-ckpt mark-complete {unmarked[-1]}`; "
        "or start the run from scratch deliberately, which trains over them",
        path=root.path,
        paths=unmarked,
    )
