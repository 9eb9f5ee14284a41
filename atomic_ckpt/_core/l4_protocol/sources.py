"""The committed checkpoint a carry's ``from_=`` or a commit's ``dedup=`` names, and its
directory pinned open while files are shared out of it (checked to be the one whose
manifest was read)."""

from __future__ import annotations

import os
from typing import cast

from atomic_ckpt._core.l1_names.errors import CheckpointNotFoundError, StepConflictError
from atomic_ckpt._core.l1_names.names import check_chosen_name, step_of
from atomic_ckpt._core.l2_syscalls import fs as _fs
from atomic_ckpt._core.l3_formats.read import Checkpoint, read_marker
from atomic_ckpt._core.l4_protocol import delete as _delete
from atomic_ckpt._core.l4_protocol.root import Root, check_step


def source_of(root: Root, from_: int | str, arg: str = "from_") -> Checkpoint:
    """The complete checkpoint ``from_`` names: a step (an int, its directory name, or its
    number as ``ls`` shows it: ``"5"`` in a ``checkpoint-`` root too) or a named checkpoint;
    CheckpointNotFoundError if there is none (or it is an alias)."""
    if isinstance(from_, str):
        step = step_of(from_, root.prefix)
        if step is None:
            _delete.refuse_alias(root, from_, arg)
            name = check_chosen_name("checkpoint name", from_, root.prefix, hidden=False)
            path = root.path / name
            try:
                manifest = read_marker(path) if not os.path.islink(path) else None
            except (OSError, ValueError):
                manifest = None
            if manifest is None:
                raise CheckpointNotFoundError(
                    f"no complete checkpoint {from_!r} in {root.path} to carry from", path=path
                )
            # A named checkpoint has no step; Checkpoint only carries it for messages.
            return Checkpoint(cast(int, manifest.step), path, manifest)
        from_ = step
    return _delete.require_complete(root, check_step(from_))


def pin(source: Checkpoint) -> int:
    """The source's directory, opened (never through a link) and checked to be the one
    whose manifest was read; the caller closes it."""
    fd = _fs.open_dir(source.path)
    try:
        still(source, fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def still(source: Checkpoint, fd: int) -> None:
    """StepConflictError unless ``source.path`` still is the directory open as ``fd``,
    holding the manifest read (another save replaced or removed it meanwhile)."""
    try:
        same = read_marker(source.path) == source.manifest and os.path.samestat(
            os.lstat(source.path), os.fstat(fd)
        )
    except (OSError, ValueError):
        same = False
    if not same:
        raise StepConflictError(
            f"{source.path} was replaced or changed while a file was being carried from "
            "it; nothing was carried: look it up again and retry",
            path=source.path,
        )
