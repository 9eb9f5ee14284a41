"""Adopt a directory written without this library (``mark_complete``): the protocol
without a rename, where the marker's own rename is the commit point."""

from __future__ import annotations

import os
import posixpath
import stat
import time
from collections.abc import Collection
from pathlib import Path
from typing import SupportsIndex

from atomic_ckpt._core.l1_names.errors import (
    CheckpointNotFoundError,
    ManifestError,
    MarkerIsDirectoryError,
    NewerFormatError,
    StepConflictError,
    VerificationError,
)
from atomic_ckpt._core.l1_names.names import (
    MARKER_TMP_PREFIX,
    is_marker_name,
    new_token,
    not_one_string,
)
from atomic_ckpt._core.l3_formats.contents import check_contents
from atomic_ckpt._core.l3_formats.manifest import Manifest
from atomic_ckpt._core.l3_formats.read import Checkpoint, moved_by_hand, read_marker
from atomic_ckpt._core.l3_formats.tree import sync_tree
from atomic_ckpt._core.l4_protocol.root import Root, check_step
from atomic_ckpt._version import __version__


def adopt(
    root: Root, step: SupportsIndex, *, check: bool = True, require: Collection[str] = ()
) -> Checkpoint:
    """``mark_complete``: write a manifest marker into a directory written without us.

    With ``check`` (the default), the files whose formats can be checked without their
    writer (:mod:`..l3_formats.contents`) are checked first, and a directory where one
    fails is refused with a :class:`VerificationError` naming each file and what is
    wrong: a legacy save torn by a kill is not adopted as complete. The tree is fsynced
    and hashed outside the root lock (it may be large, and a concurrent commit must not
    time out waiting); the marker is written under it, after checking that the
    directory is still the one that was hashed. ``require`` (paths relative to the
    directory, checked whatever ``check`` says) are regular files a complete save holds:
    one missing, or a symlink or directory in its place, refuses the directory with a
    VerificationError naming each.
    """
    step = check_step(step)
    not_one_string("require", require)
    required = [_inside(p) for p in require]
    path = root.path / root.name_of(step)
    try:
        before = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):  # (ENOTDIR: a file where the root is)
        raise CheckpointNotFoundError(
            f"{path} does not exist: nothing to mark complete", path=path, step=step
        ) from None
    if not stat.S_ISDIR(before.st_mode):
        raise StepConflictError(
            f"{path} is not a directory: only a checkpoint directory can be marked",
            path=path,
            step=step,
        )
    found = {rel: _kind(path / rel) for rel in required}
    missing = [rel for rel, kind in found.items() if kind != "file"]
    if missing:
        problems = tuple(f"{path / rel}: {found[rel]}" for rel in missing)
        raise VerificationError(
            f"refusing to mark {path} complete: {len(missing)} required file(s) are "
            "missing:\n  " + "\n  ".join(problems) + "\nA save that was cut short leaves "
            "files out: if the run that wrote it can redo the save, delete the directory",
            path=path / missing[0],
            step=step,
            problems=problems,
        )
    existing = _valid_manifest(path, step)
    if existing is not None:
        return Checkpoint(step, path, existing)
    if check:
        broken = [c for c in check_contents(path) if not c.ok]
        if broken:
            problems = tuple(
                f"{path / c.path}: {c.format + ' file ' if c.format else ''}{c.problem}"
                for c in broken
            )
            raise VerificationError(
                f"refusing to mark {path} complete: {len(broken)} file(s) are damaged, "
                "as a save killed mid-write leaves them:\n  "
                + "\n  ".join(problems)
                + "\nIf the run that wrote them can redo the save, delete the directory; "
                "to adopt it anyway, pass check=False (atomic-ckpt mark-complete --no-check)",
                path=path / broken[0].path,
                step=step,
                problems=problems,
            )
    files = sync_tree(
        path, policy=root.sync, checksum=root.checksum, workers=root.workers, skip=is_marker_name
    )
    manifest = Manifest(
        step=step,
        files=tuple(files),
        created=time.time(),
        library_version=__version__,
        checksum=root.checksum,
        metadata={"adopted": True},
    )
    with root.locked():
        try:
            now: os.stat_result | None = os.lstat(path)
        except FileNotFoundError:
            now = None
        if now is None or not os.path.samestat(before, now):
            raise CheckpointNotFoundError(
                f"{path} was removed or replaced while it was being marked complete",
                path=path,
                step=step,
            )
        existing = _valid_manifest(path, step)
        if existing is not None:  # another process adopted it meanwhile
            return Checkpoint(step, path, existing)
        # No rename follows: the marker is the commit point, so the entries of the
        # directory must be durable before the marker's rename is.
        root.sync.staging(path)
        root.sync.marker(path, manifest.to_bytes(), tmp=path / (MARKER_TMP_PREFIX + new_token()))
        root.sync.staging(path)
        # The directory's own entry in the root: a legacy writer may have just made it.
        root.sync.root(root.path)
    return Checkpoint(step, path, manifest)


def _inside(path: str | os.PathLike[str]) -> str:
    rel = posixpath.normpath(os.fspath(path).replace(os.sep, "/"))
    if rel.startswith(("/", "../")) or rel in (".", ".."):
        raise ValueError(f"require= takes paths inside the checkpoint, got {path!r}")
    return rel


def _kind(path: Path) -> str:
    """``"file"`` for a regular file, else what stands in its place: a symlink (dangling
    or not) or a directory is not the file a complete save writes there."""
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "missing"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISLNK(mode):
        return "missing (a symlink is there, not the file)"
    if stat.S_ISDIR(mode):
        return "missing (a directory is there, not the file)"
    return "missing (not a regular file)"


def _valid_manifest(path: Path, step: int) -> Manifest | None:
    """The manifest already there (None: none, legacy, or unreadable, which is replaced).
    StepConflictError for a checkpoint atomic_ckpt wrote that must not be adopted: one a
    newer release wrote (its marker is not unreadable, only newer), or a complete
    checkpoint moved or copied here by hand (its manifest records another step)."""
    try:
        existing = read_marker(path)
    except NewerFormatError as exc:
        raise StepConflictError(
            f"refusing to mark {path} complete: it holds a checkpoint a newer atomic_ckpt "
            f"wrote ({exc}). Its marker is kept: upgrade atomic_ckpt to use it",
            path=path,
            step=step,
        ) from exc
    except MarkerIsDirectoryError:
        raise  # its rename would fail; and what that directory holds is the user's
    except ManifestError:
        return None  # an unreadable marker is replaced by a valid one
    if existing is None or existing.legacy:
        return None
    if existing.step != step:
        raise StepConflictError(
            f"refusing to mark {path} complete: it already holds a complete checkpoint "
            f"moved or copied there by hand ({moved_by_hand(existing, step)}). "
            "mark_complete adopts directories written without atomic_ckpt only",
            path=path,
            step=step,
        )
    return existing
