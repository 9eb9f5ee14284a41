"""Carry a committed file or subtree into an open commit without writing it again.

:meth:`Commit.carry <atomic_ckpt.Commit.carry>` is built on this. The file is put into
the staging dir by reflink, hard link or copy (:func:`.share.share_file`), and its
manifest entry (size, checksum) is reused from the source's manifest, never recomputed,
only once the source is known to be the file that entry describes:

* **committed**: the manifest records the file's inode, size and modification time (ns)
  as they were just before it was hashed at its commit, and the file opened now has the
  same three, on its marker's device (not its directory's: an overlay over two
  filesystems gives those its own), and that time is more than 2 s (:data:`RACY_NS`)
  before its marker's. Writing into a file changes its modification
  time, so a file written in place since is not trusted; one written within a timestamp
  tick of its commit (git's "racily clean" file) is verified;
* **verified**: otherwise (a manifest written before identities were recorded, a
  checkpoint copied elsewhere, a file touched) the carried bytes are hashed once and
  compared with the entry's checksum: equal, it is carried; different, the carry is
  refused (:class:`~atomic_ckpt.VerificationError`) and nothing of it stays. A source
  without checksums cannot be verified and is refused.

The shared files wait at private names in the staging dir's top level (``CARRYING.<random>
.<carry>.<file>``), never at their own names while the block runs (a plain ``open(name,
"wb")`` there would truncate the source through a hard link); :func:`place` renames them
to their names at the publish, after the block's writes, through directory descriptors
(never following a link): a name the block wrote keeps the block's file. No directory is
made for the waiting files, so none is removed at the publish (an ``rmdir`` frees a block:
on a filesystem mounted with ``discard`` and no journal that is a synchronous discard,
3-20 ms). Durability comes with the commit: its tree walk, after the placement, fsyncs
every file of the staging dir (a reflink's or copy's new data and metadata) and every
directory (a hard link's new entry).
At the publish a carried file still having the identity it had when carried is not hashed
again; one written in place meanwhile (same inode, new size or time: through a link shared
with a committed checkpoint) stops the commit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import posixpath
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from atomic_ckpt._core.l1_names.errors import (
    CheckpointNotFoundError,
    CommitStateError,
    ManifestError,
    VerificationError,
)
from atomic_ckpt._core.l1_names.names import MARKER, not_a_mapping
from atomic_ckpt._core.l2_syscalls import fs as _fs
from atomic_ckpt._core.l2_syscalls import share as _share
from atomic_ckpt._core.l2_syscalls.checksums import CHECKSUMS, checksum_file
from atomic_ckpt._core.l2_syscalls.forksafe import ProcessLock
from atomic_ckpt._core.l3_formats.manifest import FileEntry
from atomic_ckpt._core.l3_formats.read import Checkpoint
from atomic_ckpt._core.l3_formats.tree import Identity, identity
from atomic_ckpt._core.l4_protocol import sources as _sources
from atomic_ckpt._core.l4_protocol.root import Root

log = logging.getLogger("atomic_ckpt._core.l4_protocol.commit")

Method = _share.Method
Carried = dict[str, tuple[FileEntry, Identity]]
"""A commit's carried files: relative path -> (its entry, its identity when carried)."""

_RANK: dict[Method, int] = {"reflink": 0, "hardlink": 1, "copy": 2}

CARRYING = ".carrying.tmp-atomic_ckpt"
"""The prefix of the private names (:func:`waiting_name`) in the staging dir's top level
where carried files wait for the publish, never at their own names while the block runs:
nothing the block opens for writing there can reach a file shared with a committed
checkpoint. Gone before the tree walk; removed with the staging dir on an abort."""


RACY_NS = 2 * 10**9
"""A file whose recorded mtime is not older than its marker's by more than this (the
coarsest timestamp granularity: FAT, some NFS servers) is racily clean (git's rule): a
same-size write in the tick it was hashed in kept its mtime, so it is hashed to be carried."""

_RESERVE = ProcessLock()
"""Held while a carry takes its number (its slot in the commit's pending carries): never
shared by two carries, which joined threads may make at once (a refused carry leaves its
slot empty and inert, so no later one takes its number)."""


def waiting_name(carry: int, file: int, token: str) -> str:
    """The private name at which file ``file`` of the ``carry``-th carry of a commit waits
    in the staging dir's top level for the publish; ``token`` is random, drawn by each
    carry, so no name a checkpoint was committed with (nor one the block wrote before the
    carry) is ever a waiting name: the publish would take that file for the carried one."""
    return f"{CARRYING}.{token}.{carry}.{file}"


def relative(relpath: str | os.PathLike[str]) -> str:
    """``relpath`` as a normalized relative POSIX path inside a checkpoint (a trailing
    ``/`` allowed: ``"tokenizer/"``); ValueError if it is empty, absolute or climbs out."""
    text = os.fspath(relpath).replace(os.sep, "/")
    rel = posixpath.normpath(text) if text else ""
    if rel in ("", ".", "..") or rel.startswith(("/", "../")):
        raise ValueError(f"carry takes a file or directory inside the checkpoint, got {relpath!r}")
    return rel


_NOT_THERE = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ELOOP})
"""errnos of a source path that is missing or has a link or a file on it."""


@dataclasses.dataclass
class Pending:
    """One carry of an open commit, its files waiting at :func:`waiting_name` names in the
    staging dir for the publish to put them at theirs (see :func:`place`)."""

    rel: str
    waiting: dict[str, str]  # entry path -> the name its file waits at
    entries: list[FileEntry]
    made: dict[str, tuple[FileEntry, Identity]]
    reuse: bool  # the source's algorithm is the root's: its entries are reused


class Listed(list[Pending]):
    """The pending carries of a commit whose publish the caller gives its file list
    (``distributed_commit``, the DCP writer): :func:`carry` refuses at once."""

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what


def carry(
    root: Root,
    staging: Path,
    pending: list[Pending],
    relpath: str | os.PathLike[str],
    from_: int | str,
) -> Method:
    """See :meth:`Commit.carry <atomic_ckpt.Commit.carry>`: share the files into the
    staging dir at their :func:`waiting_name` and append the carry to ``pending`` (the
    commit's); a refused carry leaves the staging dir as it was."""
    if isinstance(pending, Listed):
        raise CommitStateError(
            f"nothing can be carried into {staging}: it is {pending.what}, whose publish is "
            "given the list of its files, not walked. Write the file, or use dedup=True to "
            "link what equals the previous checkpoint's; nothing was carried",
            path=staging,
        )
    rel = relative(relpath)
    for other in pending:
        if rel == other.rel or rel.startswith(other.rel + "/") or other.rel.startswith(rel + "/"):
            raise FileExistsError(
                f"{rel!r} was already carried into this commit (as {other.rel!r}): carry "
                "each path once"
            )
    source = _sources.source_of(root, from_)
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
    _check_free(staging, rel)
    pin = _sources.pin(source)
    with _RESERVE:  # a number of its own, even for carries made at once from joined threads
        number = len(pending)
        pending.append(Pending("", {}, [], {}, False))  # inert until filled in below
    waiting: dict[str, str] = {}
    made: dict[str, tuple[FileEntry, Identity]] = {}
    token = secrets.token_hex(8)
    try:
        methods = []
        for entry in entries:
            if entry.type == "file":
                name = waiting_name(number, len(waiting), token)
                methods.append(_one(staging / name, source, pin, entry, made))
                waiting[entry.path] = name  # (a refused one left nothing there)
    except BaseException:
        for name in waiting.values():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(staging / name)
        raise
    finally:
        os.close(pin)
    same_algorithm = manifest.checksum is not None and manifest.checksum == root.checksum
    pending[number] = Pending(rel, waiting, entries, made, same_algorithm)
    return max(methods, key=_RANK.__getitem__) if methods else "copy"


def _check_free(staging: Path, rel: str) -> None:
    """FileExistsError if ``rel`` exists in ``staging``; NotADirectoryError if one of its
    parents there is anything but a directory (a symlink is never followed)."""
    parts = rel.split("/")
    for i in range(1, len(parts)):
        path = staging.joinpath(*parts[:i])
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(mode):
            raise _not_a_dir(path, stat.S_ISLNK(mode))
    if os.path.lexists(staging / rel):
        raise FileExistsError(
            f"{staging / rel} already exists in the staging directory: carry a path before "
            "writing anything there, or carry its files one by one"
        )


def _not_a_dir(path: Path, link: bool) -> NotADirectoryError:
    what = "a symbolic link" if link else "not a directory"
    return NotADirectoryError(
        errno.ENOTDIR,
        f"{path} is {what}: a carry puts files only into real directories of the staging "
        "dir and never follows a link (it could point anywhere). Remove it, or carry to "
        "another path",
        str(path),
    )


def place(
    staging: Path, staging_fd: int | None, pending: list[Pending], carried: Carried, *, walk: bool
) -> None:
    """At the publish, once the block's writes are done: put each pending carry's entries
    at their names in ``staging`` (open as ``staging_fd``) and record the placed files'
    entries in ``carried``; the waiting names of files not placed are removed.

    A name the block wrote itself keeps the block's file (a directory merges with the
    carried one): the carried entry at it, and anything carried below it, is dropped
    (logged). A parent of a carried path that the block made anything but a directory
    (a symlink above all) is NotADirectoryError: nothing is placed through it. Every
    step is relative to a directory descriptor, never following a link. ``walk``: the
    publish walks the tree (a caller passing its own file list cannot carry)."""
    if not pending:
        return
    if not walk:
        raise CommitStateError(
            f"{staging} has carried files, and the publish was given its file list: "
            "carry only into a commit whose publish() walks the tree (no files=)",
            path=staging,
        )
    assert staging_fd is not None  # an open commit's
    for p in pending:
        try:
            _place(staging, staging_fd, p, carried)
        finally:
            for name in p.waiting.values():  # those dropped (or left by a failure)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=staging_fd)
    pending.clear()


def _place(staging: Path, staging_fd: int, p: Pending, carried: Carried) -> None:
    dropped: list[str] = []
    for entry in p.entries:
        if any(entry.path.startswith(d + "/") for d in dropped):
            continue
        parts = entry.path.split("/")
        try:
            dst = _share.open_dirs(staging_fd, parts[:-1], create=True)
        except OSError as exc:
            if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                raise
            raise _first_not_a_dir(staging, parts[:-1]) from exc
        try:
            name = parts[-1]
            try:
                mode: int | None = os.stat(name, dir_fd=dst, follow_symlinks=False).st_mode
            except FileNotFoundError:
                mode = None
            if mode is not None:
                if entry.type == "dir" and stat.S_ISDIR(mode):
                    continue  # the block made it too: the carried entries merge into it
                dropped.append(entry.path)
                log.info(
                    "carry: the block wrote %s itself; its own is committed, the one carried "
                    "is dropped",
                    staging / entry.path,
                )
                continue
            if entry.type == "dir":
                _share.make_at(dst, name)
            elif entry.type == "symlink":
                _share.make_at(dst, name, symlink=entry.target or "")
            else:
                old = p.waiting.pop(entry.path)
                try:
                    _share.move_at(staging_fd, dst, name, old=old)
                except FileNotFoundError as exc:
                    raise FileNotFoundError(
                        errno.ENOENT,
                        f"{entry.path}, carried into this commit, waited at {old} in the "
                        "staging dir, and the block removed it: nothing was committed. "
                        "Remove only what the block wrote, or carry the file again",
                        str(staging / old),
                    ) from exc
                if p.reuse:
                    carried[entry.path] = p.made[entry.path]
        finally:
            os.close(dst)


def _first_not_a_dir(staging: Path, parts: list[str]) -> NotADirectoryError:
    for i in range(1, len(parts) + 1):
        path = staging.joinpath(*parts[:i])
        with contextlib.suppress(OSError):
            mode = os.lstat(path).st_mode
            if not stat.S_ISDIR(mode):
                return _not_a_dir(path, stat.S_ISLNK(mode))
    return _not_a_dir(staging.joinpath(*parts), False)


def _one(
    target: Path,
    source: Checkpoint,
    pin: int,
    entry: FileEntry,
    made: dict[str, tuple[FileEntry, Identity]],
) -> Method:
    """Share the file ``entry`` of ``source`` as ``target`` (nothing left there if it is
    refused); the method."""
    try:
        method, st = _share.share_file(pin, entry.path, target)
    except OSError as exc:
        # Only what says the source is not that file any more is the source's fault; a
        # full disk, a quota, an I/O error or a staging dir gone (the commit aborted)
        # while making the new name propagates as is.
        source_side = isinstance(exc, _fs.NotRegularFileError) or exc.errno in _NOT_THERE
        if not source_side or not os.path.isdir(target.parent):
            raise
        _sources.still(source, pin)  # replaced by another save meanwhile: say that
        raise _changed(source, entry, f"it cannot be opened as a regular file ({exc})") from exc
    try:
        now = _check_source(target, source, pin, entry, st)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(target)
        raise
    # The entry, with no identity of its own (the walk records the carrier's).
    made[entry.path] = (dataclasses.replace(entry, ino=None, mtime_ns=None), now)
    return method


def _check_source(
    target: Path, source: Checkpoint, pin: int, entry: FileEntry, st: os.stat_result
) -> Identity:
    """VerificationError unless the file shared as ``target`` (the source's stat ``st``)
    is the one ``entry`` describes: the same identity as at its commit, else the same
    bytes; the identity of ``target`` (what the publish checks it still has)."""
    algorithm = source.manifest.checksum
    hashable = algorithm in CHECKSUMS and entry.checksum is not None
    # The device the inode number is read on: the marker's, a regular file written with
    # the checkpoint's (an overlay over two filesystems gives its directories its own
    # device, its files their layer's: the directory's would never match).
    marker = os.stat(MARKER, dir_fd=pin, follow_symlinks=False)
    committed = (
        entry.ino is not None
        and entry.mtime_ns is not None
        and st.st_dev == marker.st_dev
        and (st.st_ino, st.st_size, st.st_mtime_ns) == (entry.ino, entry.size, entry.mtime_ns)
        # Racily clean: hashed if it can be (without checksums nothing is claimed).
        and (not hashable or entry.mtime_ns < marker.st_mtime_ns - RACY_NS)
    )
    now = os.lstat(target)
    if st.st_size != entry.size:
        raise _changed(source, entry, f"it is {st.st_size} bytes")
    if not committed:
        if algorithm is None or not hashable:
            raise _changed(source, entry, "it changed since its commit and has no checksum")
        if checksum_file(target, algorithm) != entry.checksum or identity(
            os.lstat(target)
        ) != identity(now):
            raise _changed(source, entry, "its checksum differs")
    return identity(now)


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
    """:meth:`Commit.carry` each path of ``carry`` (``commit(carry=)``) from its source; logged."""
    not_a_mapping("carry", carry, "each relative path to the step or name it comes from: {'a/': 4}")
    for relpath, source in (carry or {}).items():
        how = commit.carry(relpath, from_=source)
        log.info("carried %s from %s into %s (%s)", relpath, source, commit.name, how)
