"""Carry a committed file or subtree into an open commit without writing it again.

:meth:`Commit.carry <atomic_ckpt.Commit.carry>` is built on this. The file is put into
the staging dir by reflink, hard link or copy (:func:`.share.share_file`), and its
manifest entry (size, checksum) is reused from the source's manifest, never recomputed,
only once the source is known to be the file that entry describes:

* **committed**: the manifest records the file's inode, size and modification time (ns)
  as they were just before it was hashed at its commit, and the file opened now has the
  same three, on the source checkpoint's device. Writing into a file changes its
  modification time, so a file written in place since is not trusted;
* **verified**: otherwise (a manifest written before identities were recorded, a
  checkpoint copied elsewhere, a file touched) the carried bytes are hashed once and
  compared with the entry's checksum: equal, it is carried; different, the carry is
  refused (:class:`~atomic_ckpt.VerificationError`) and nothing of it stays. A source
  without checksums cannot be verified and is refused.

Durability comes with the commit: its tree walk fsyncs every file of the staging dir (a
reflink's or copy's new data and metadata) and every directory (a hard link's new entry).
At the publish a carried file still having the identity it had when carried is not hashed
again; one written in place meanwhile (same inode, new size or time: through a link shared
with a committed checkpoint) stops the commit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import posixpath
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from atomic_ckpt._core.l1_names.errors import (
    CheckpointNotFoundError,
    ManifestError,
    StepConflictError,
    VerificationError,
)
from atomic_ckpt._core.l1_names.names import check_chosen_name, parse_step
from atomic_ckpt._core.l2_syscalls import fs as _fs
from atomic_ckpt._core.l2_syscalls import share as _share
from atomic_ckpt._core.l2_syscalls.checksums import CHECKSUMS, checksum_file
from atomic_ckpt._core.l3_formats.manifest import FileEntry
from atomic_ckpt._core.l3_formats.read import Checkpoint, read_marker
from atomic_ckpt._core.l3_formats.tree import Identity, identity
from atomic_ckpt._core.l4_protocol import delete as _delete
from atomic_ckpt._core.l4_protocol.root import Root, check_step

log = logging.getLogger("atomic_ckpt._core.l4_protocol.commit")

Method = _share.Method
Carried = dict[str, tuple[FileEntry, Identity]]
"""A commit's carried files: relative path -> (its entry, its identity when carried)."""

_RANK: dict[Method, int] = {"reflink": 0, "hardlink": 1, "copy": 2}


def relative(relpath: str | os.PathLike[str]) -> str:
    """``relpath`` as a normalized relative POSIX path inside a checkpoint (a trailing
    ``/`` allowed: ``"tokenizer/"``); ValueError if it is empty, absolute or climbs out."""
    text = os.fspath(relpath).replace(os.sep, "/")
    rel = posixpath.normpath(text) if text else ""
    if rel in ("", ".", "..") or rel.startswith(("/", "../")):
        raise ValueError(f"carry takes a file or directory inside the checkpoint, got {relpath!r}")
    return rel


def source_of(root: Root, from_: int | str) -> Checkpoint:
    """The complete checkpoint ``from_`` names: a step (an int, or its directory name) or
    a named checkpoint; CheckpointNotFoundError if there is none."""
    if isinstance(from_, str):
        step = parse_step(from_, root.prefix)
        if step is None:
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


def _pin(source: Checkpoint) -> int:
    """The source's directory, opened (never through a link) and checked to be the one
    whose manifest was read; the caller closes it."""
    fd = _fs.open_dir(source.path)
    try:
        same = read_marker(source.path) == source.manifest and os.path.samestat(
            os.lstat(source.path), os.fstat(fd)
        )
    except (OSError, ValueError):
        same = False
    if not same:
        os.close(fd)
        raise StepConflictError(
            f"{source.path} was replaced or changed while a file was being carried from "
            "it; nothing was carried: look it up again and retry",
            path=source.path,
        )
    return fd


def carry(
    root: Root, staging: Path, carried: Carried, relpath: str | os.PathLike[str], from_: int | str
) -> Method:
    """See :meth:`Commit.carry <atomic_ckpt.Commit.carry>`: carry into ``staging`` and
    record the carried files' entries in ``carried`` (the commit's)."""
    rel = relative(relpath)
    source = source_of(root, from_)
    manifest = source.manifest
    if manifest.legacy:
        raise ManifestError(
            f"{source.path} has a legacy (empty) marker: nothing records its files, so "
            "none can be carried. Adopt it first (mark_complete), or write the files",
            path=source.path,
        )
    entries = [e for e in manifest.files if e.path == rel or e.path.startswith(rel + "/")]
    if not entries:
        raise CheckpointNotFoundError(
            f"{source.path} has no file or directory {rel!r} to carry", path=source.path
        )
    target = staging / rel
    if os.path.lexists(target):
        raise FileExistsError(
            f"{target} already exists in the staging directory: carry a path before "
            "writing anything there, or carry its files one by one"
        )
    pin = _pin(source)
    made: list[tuple[str, tuple[FileEntry, Identity]]] = []
    same_algorithm = manifest.checksum is not None and manifest.checksum == root.checksum
    try:
        for parent in reversed(target.relative_to(staging).parents[:-1]):
            if not os.path.lexists(staging / parent):
                _fs.mkdir(staging / parent)
        methods = [_one(staging, source, pin, entry, made) for entry in entries]
    except BaseException:
        with contextlib.suppress(OSError):
            _fs.remove_tree(target)
        raise
    finally:
        os.close(pin)
    if same_algorithm:  # else the walk hashes them with the root's algorithm
        carried.update(made)
    files = [m for m in methods if m is not None]
    return max(files, key=_RANK.__getitem__) if files else "copy"


def _one(
    staging: Path,
    source: Checkpoint,
    pin: int,
    entry: FileEntry,
    made: list[tuple[str, tuple[FileEntry, Identity]]],
) -> Method | None:
    """Carry one entry of ``source``; the method for a file, None for anything else."""
    target = staging / entry.path
    if entry.type == "dir":
        _fs.mkdir(target)
        return None
    if entry.type == "symlink":
        _fs.symlink(entry.target or "", target)
        return None
    try:
        method, st = _share.share_file(pin, entry.path, target)
    except OSError as exc:
        raise _changed(source, entry, f"it cannot be opened as a regular file ({exc})") from exc
    algorithm = source.manifest.checksum
    committed = (
        entry.ino is not None
        and st.st_dev == os.fstat(pin).st_dev
        and (st.st_ino, st.st_size, st.st_mtime_ns) == (entry.ino, entry.size, entry.mtime_ns)
    )
    now = os.lstat(target)
    if st.st_size != entry.size:
        raise _changed(source, entry, f"it is {st.st_size} bytes")
    if not committed:
        if algorithm is None or algorithm not in CHECKSUMS or entry.checksum is None:
            raise _changed(source, entry, "it changed since its commit and has no checksum")
        if checksum_file(target, algorithm) != entry.checksum or identity(
            os.lstat(target)
        ) != identity(now):
            raise _changed(source, entry, "its checksum differs")
    # The entry, with no identity of its own (the walk records the carrier's).
    bare = dataclasses.replace(entry, ino=None, mtime_ns=None)
    made.append((entry.path, (bare, identity(now))))
    return method


def _changed(source: Checkpoint, entry: FileEntry, why: str) -> VerificationError:
    path = source.path / entry.path
    return VerificationError(
        f"{path} cannot be carried: {why}, while its manifest records a file of "
        f"{entry.size} bytes. It was changed after its commit; run verify() on that "
        "checkpoint, and write the file anew. Nothing of this carry was kept",
        path=path,
        problems=(f"{path}: changed after its commit ({why})",),
    )


def carry_all(commit: Any, carry: Mapping[str, int | str] | None) -> None:
    """:meth:`Commit.carry` each relative path of ``carry`` from the checkpoint it maps to
    (the ``carry=`` argument of ``commit()``); how each was carried is logged."""
    for relpath, source in (carry or {}).items():
        how = commit.carry(relpath, from_=source)
        log.info("carried %s from %s into %s (%s)", relpath, source, commit.name, how)
