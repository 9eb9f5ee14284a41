"""Named checkpoints (``root/interrupted/``) beside the numbered ones.

Committed with the same protocol as a step (staging, fsync, marker, rename),
their manifest records no step, and the scanner never counts them:
``latest()`` and ``steps()`` see numbered checkpoints only. A directory is complete
only under the name its manifest records: a named checkpoint moved by hand to a
step's name is not a complete step, and a step moved to a name is not a named
checkpoint (a hand copy cut short would otherwise look complete). ``promote``
turns one into a step atomically: its manifest is rewritten to record the
step (durably, in place), then it is renamed to the step's name (exchanged
with an existing step where the filesystem can, so that step is never missing).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from atomic_ckpt._core.l1_names.errors import CheckpointNotFoundError, StepConflictError
from atomic_ckpt._core.l1_names.names import check_chosen_name
from atomic_ckpt._core.l3_formats.manifest import Manifest
from atomic_ckpt._core.l3_formats.read import Checkpoint, moved_by_hand, read_marker
from atomic_ckpt._core.l4_protocol import amend as _amend
from atomic_ckpt._core.l4_protocol import begin as _begin
from atomic_ckpt._core.l4_protocol import delete as _delete
from atomic_ckpt._core.l4_protocol.root import Root, check_step


@dataclass(frozen=True)
class NamedCheckpoint:
    """A complete named checkpoint: its name, its directory and its manifest."""

    name: str
    path: Path
    manifest: Manifest


def check_name(root: Root, name: str) -> str:
    """``name`` if it can name a checkpoint; ValueError otherwise (see
    :func:`~atomic_ckpt._core.l1_names.names.check_chosen_name`)."""
    return check_chosen_name("checkpoint name", name, root.prefix, hidden=False)


def get(root: Root, name: str) -> NamedCheckpoint:
    """The complete named checkpoint ``name``; CheckpointNotFoundError if there is none."""
    path = root.path / check_name(root, name)
    try:
        manifest = read_marker(path) if os.path.isdir(path) and not os.path.islink(path) else None
    except (OSError, ValueError) as exc:
        raise CheckpointNotFoundError(f"{path} is incomplete: {exc}", path=path) from None
    if manifest is None:
        raise CheckpointNotFoundError(
            f"no complete named checkpoint {name!r} in {root.path}", path=path
        )
    if not manifest.legacy and manifest.step is not None:
        raise CheckpointNotFoundError(
            f"{path} is not a complete named checkpoint: {moved_by_hand(manifest, None)}",
            path=path,
        )
    return NamedCheckpoint(name, path, manifest)


def listing(root: Root) -> list[NamedCheckpoint]:
    """Every complete named checkpoint of the root, by name."""
    out: list[NamedCheckpoint] = []
    try:
        names = sorted(os.listdir(root.path))
    except (FileNotFoundError, NotADirectoryError):
        return out
    for name in names:
        try:
            out.append(get(root, check_name(root, name)))
        except (ValueError, CheckpointNotFoundError):
            continue
    return out


def promote(root: Root, name: str, step: int, *, replace_unusable: bool = False) -> Checkpoint:
    """Turn the named checkpoint ``name`` into step ``step``, atomically and durably.

    A commit of ``step`` whose files are hard links to the named checkpoint's (copies
    where links are refused, entries reused as an amend reuses them), promoted like any
    commit (replacing an existing step by exchange) with the name's aliases; then the
    named checkpoint is deleted. A crash leaves the named checkpoint, the step, or
    both, each holding its own files: never neither, and never a name holding another
    checkpoint's files. Promoting again after a crash gives the same result.
    """
    step = check_step(step)
    named = get(root, name)
    if named.manifest.legacy:
        raise StepConflictError(
            f"{named.path} has a legacy (empty) marker: nothing records its files",
            path=named.path,
        )
    aliases = [p.name for p in _delete.aliases_of(root, {named.path.name})]
    # Carried entries keep their checksums: the step's manifest uses the same algorithm.
    root = dataclasses.replace(root, checksum=named.manifest.checksum)
    base = Checkpoint(step, named.path, named.manifest)
    pin = _amend.Pinned.of(base, "promoted")
    try:
        commit = _begin.begin(
            root,
            step,
            metadata=named.manifest.metadata,
            aliases=aliases,
            replace_unusable=replace_unusable,
        )
        try:
            files = _amend.carry_over(root, base, commit.path, [], set(), pin=pin)
            # The named checkpoint must still be the version carried when the step appears.
            commit._precondition = pin.check
            ckpt = commit.publish(files=files)
        except BaseException as exc:
            commit.abort(exc)
            raise
        with root.locked():
            try:
                pin.check()
            except (StepConflictError, CheckpointNotFoundError):
                moved = []  # committed again (or removed) since: a newer save, kept
            else:
                moved = _delete.move_aside(root, [named.path])
    finally:
        pin.close()
    _delete.remove_moved(root, moved)
    return ckpt
