"""Amend a committed checkpoint: add or replace files, remove some, merge metadata.

The result replaces the step exactly like a commit (staging dir, fsync, marker,
exchange, root fsync), but the files carried over from the committed version
are hard links to it (copies where the filesystem refuses links) whose manifest
entries are reused: they are neither hashed nor fsynced again, since their data
is already durable and the old copy disappears at the promotion, so nothing
can write through the link into a live checkpoint. A metadata-only amend
rewrites the marker in place instead: one small durable write, no tree walk.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import posixpath
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any, SupportsIndex

from atomic_ckpt._core.l1_names.errors import StepConflictError
from atomic_ckpt._core.l1_names.names import MARKER_TMP_PREFIX, is_marker_name, new_token
from atomic_ckpt._core.l2_syscalls import fs as _fs
from atomic_ckpt._core.l3_formats.manifest import FileEntry, Manifest, check_metadata
from atomic_ckpt._core.l3_formats.read import Checkpoint, classify
from atomic_ckpt._core.l3_formats.tree import sync_tree
from atomic_ckpt._core.l4_protocol import commit as _commit
from atomic_ckpt._core.l4_protocol import delete as _delete
from atomic_ckpt._core.l4_protocol.root import Root, check_step


@contextlib.contextmanager
def amend(
    root: Root,
    step: SupportsIndex,
    *,
    metadata: Mapping[str, Any] | None = None,
    remove: Collection[str] = (),
) -> Iterator[Path]:
    """See :meth:`CheckpointDir.amend <atomic_ckpt.CheckpointDir.amend>`."""
    step = check_step(step)
    extra = check_metadata(metadata)
    if isinstance(remove, str):
        raise TypeError("remove must be a collection of paths, not one string")
    gone = {_relative(p) for p in remove}
    base = _delete.require_complete(root, step)  # only a committed checkpoint is amended
    if base.manifest.legacy:
        raise StepConflictError(
            f"{base.path} has a legacy (empty) marker: nothing records its files. Adopt it "
            f"first with `atomic-ckpt mark-complete {base.path}`",
            path=base.path,
            step=step,
        )
    # Carried entries keep their checksums: hash the new files with the same algorithm.
    root = dataclasses.replace(root, checksum=base.manifest.checksum)
    commit = _commit.begin(root, step)
    try:
        yield commit.path
        written = sync_tree(
            commit.path,
            policy=root.sync,
            checksum=root.checksum,
            workers=root.workers,
            skip=is_marker_name,
        )
        merged = {**base.manifest.metadata, **extra}
        if not written and not gone:
            # Metadata only: the files stay where they are; only the marker changes.
            commit.abort()
            _rewrite_marker(root, base, merged)
            return
        commit.metadata = merged
        carried = carry_over(root, base, commit.path, written, gone)
        commit.publish(files=sorted([*written, *carried], key=lambda e: e.path))
    except BaseException as exc:
        commit.abort(exc)
        raise


def _relative(path: str | os.PathLike[str]) -> str:
    rel = posixpath.normpath(os.fspath(path).replace(os.sep, "/"))
    if rel.startswith(("/", "../")) or rel in (".", ".."):
        raise ValueError(f"remove= takes paths inside the checkpoint, got {path!r}")
    return rel


def _covered(rel: str, paths: Collection[str]) -> bool:
    """Is ``rel`` one of ``paths`` or below one of them?"""
    parts = rel.split("/")
    return any("/".join(parts[:i]) in paths for i in range(1, len(parts) + 1))


def carry_over(
    root: Root, base: Checkpoint, staging: Path, written: list[FileEntry], gone: set[str]
) -> list[FileEntry]:
    """Bring every entry of ``base`` that was neither written anew nor removed into
    ``staging``; return their manifest entries (reused as recorded)."""
    new_files = {e.path for e in written if e.type != "dir"}
    out: list[FileEntry] = []
    for entry in base.manifest.files:  # sorted by path: parents before children
        target = staging / entry.path
        if _covered(entry.path, gone) or _covered(entry.path, new_files):
            continue
        if os.path.lexists(target):  # a directory the new files live in as well
            continue
        if entry.type == "dir":
            _fs.mkdir(target)
        elif entry.type == "symlink":
            _fs.symlink(entry.target or "", target)
        elif _fs.link_or_copy(base.path / entry.path, target):
            root.sync.file(target)  # a copy's data is new: flush it
        out.append(entry)
    # The directories that received entries: their new entries must be durable
    # before the rename (the staging dir itself is fsynced with the marker).
    for directory in sorted({(staging / e.path).parent for e in out} - {staging}):
        root.sync.subdir(directory)
    return out


def _rewrite_marker(root: Root, base: Checkpoint, metadata: dict[str, Any]) -> None:
    """Replace ``base``'s marker by one with ``metadata``, atomically and durably.

    Under the root lock, and only if the checkpoint is still the one amended
    (else a concurrent commit won: StepConflictError, nothing written).
    """
    old = base.manifest
    manifest = Manifest(
        step=old.step,
        files=old.files,
        created=old.created,
        library_version=old.library_version,
        checksum=old.checksum,
        metadata=metadata,
    )
    with root.locked():
        now = classify(base.path, base.step) if base.path.is_dir() else None
        if now is None or now.manifest != old:
            raise StepConflictError(
                f"{base.path} changed while it was being amended; amend it again",
                path=base.path,
                step=base.step,
            )
        tmp = base.path / (MARKER_TMP_PREFIX + new_token())
        root.sync.marker(base.path, manifest.to_bytes(), tmp=tmp)
        root.sync.staging(base.path)
