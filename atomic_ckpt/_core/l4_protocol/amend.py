"""Amend a committed checkpoint: add or replace files, remove some, merge metadata.

The result replaces the step exactly like a commit (staging dir, fsync, marker,
exchange, root fsync), but the files carried over from the committed version
are hard links to it (copies where the filesystem refuses links) whose manifest
entries are reused: they are neither hashed nor fsynced again, since their data
is already durable and the old copy disappears at the promotion, so nothing
can write through the link into a live checkpoint. A metadata-only amend
rewrites the marker in place instead: one small durable write, no tree walk.

The committed version is pinned when the amend starts (its directory held open):
the files are carried over from that directory, walked without following any
link found inside it, and the promotion checks, under the root lock, that the
step is still that version with that manifest. A concurrent commit, amend or
delete of the step makes the amend fail (StepConflictError,
CheckpointNotFoundError); it never publishes one version's files under another's
manifest. Only the process that began an amend can end it: a child forked
inside the block that leaves it normally gets CommitStateError and changes nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import posixpath
import stat
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any, SupportsIndex

from atomic_ckpt._core.l1_names.errors import (
    CheckpointNotFoundError,
    CommitStateError,
    ManifestError,
    StepConflictError,
    VerificationError,
)
from atomic_ckpt._core.l1_names.names import (
    MARKER,
    MARKER_TMP_PREFIX,
    is_marker_name,
    new_token,
    not_one_string,
)
from atomic_ckpt._core.l2_syscalls import fs as _fs
from atomic_ckpt._core.l2_syscalls.checksums import CHECKSUMS
from atomic_ckpt._core.l3_formats.manifest import FileEntry, Manifest, check_metadata
from atomic_ckpt._core.l3_formats.read import Checkpoint, classify, read_marker
from atomic_ckpt._core.l3_formats.tree import sync_tree, walk
from atomic_ckpt._core.l4_protocol import begin as _begin
from atomic_ckpt._core.l4_protocol import carry as _carrying
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
    not_one_string("remove", remove)
    gone = {_relative(p) for p in remove}
    base = _delete.require_complete(root, step)  # only a committed checkpoint is amended
    if base.manifest.legacy:
        raise StepConflictError(
            f"{base.path} has a legacy (empty) marker: nothing records its files. Adopt it "
            f"first with `atomic-ckpt mark-complete {base.path}`",
            path=base.path,
            step=step,
        )
    pid = os.getpid()
    pin = Pinned.of(base, "amended")
    try:
        # Carried entries keep their checksums: hash the new files with the same algorithm.
        root = dataclasses.replace(root, checksum=base.manifest.checksum)
        commit = _begin.begin(root, step, metadata=extra)  # joined blocks merge into it
        commit.as_block()
        try:
            yield commit.path
            if os.getpid() == pid:
                commit.seal()  # blocks that joined it ended; CommitStateError if one failed
            if os.getpid() != pid:
                raise CommitStateError(
                    f"cannot end the amend of {base.path}: it belongs to process {pid}, and "
                    f"this is process {os.getpid()} (forked inside the amend). Only the "
                    "process that began an amend may end it; end a forked child with "
                    "os._exit()",
                    path=commit.path,
                    step=step,
                )
            _require_algorithm(root, base, commit.path)
            # Files carried in (a joined block's carry=) go to their names, then are
            # hashed with the new files: an amend passes its own file list to the publish.
            _carrying.place(commit.path, commit._fd, commit._pending, {}, walk=True)
            written = sync_tree(
                commit.path,
                policy=root.sync,
                checksum=root.checksum,
                workers=root.workers,
                skip=is_marker_name,
            )
            merged = {**base.manifest.metadata, **commit.metadata}  # the amend's and joins'
            joined_options = commit.aliases or commit.replace_aliases or commit.retain
            if not written and not gone and not joined_options:
                # Metadata only: the files stay where they are; only the marker changes.
                commit.abort()
                _rewrite_marker(root, base, merged)
                return
            commit.metadata = merged
            carried = carry_over(root, base, commit.path, written, gone, pin=pin)
            commit._precondition = pin.check  # under the lock, before the exchange
            commit.publish(files=sorted([*written, *carried], key=lambda e: e.path))
        except BaseException as exc:
            commit.abort(exc)
            commit._raise_disk_full(exc)
            raise
    finally:
        pin.close()


class Pinned:
    """A committed checkpoint's directory held open from the moment its manifest was read:
    what an amend or a promotion carries files from, and checks is still in place.

    The descriptor pins the directory's identity (its inode cannot be reused while it is
    open), and the marker's identity is noted once its contents were found to be the
    manifest read, so :meth:`check` (run under the root lock) tells that version from
    any later one without reading the marker again.
    """

    def __init__(self, ckpt: Checkpoint, fd: int, verb: str) -> None:
        self.ckpt = ckpt
        self.fd = fd
        self._verb = verb
        self._marker: tuple[int, ...] | None = None

    @classmethod
    def of(cls, ckpt: Checkpoint, verb: str) -> Pinned:
        """Pin ``ckpt`` (``verb``: what is done to it, for the messages: "amended")."""
        try:
            fd = _fs.open_dir(ckpt.path)
        except OSError:
            fd = -1
        pinned = cls(ckpt, fd, verb)
        try:
            if fd < 0:
                raise pinned._gone()
            # The directory opened and its marker are the ones whose manifest was read:
            # the marker's identity before and after its contents are compared.
            before = pinned._marker_now()
            pinned._require_same_dir()
            try:
                same = read_marker(ckpt.path) == ckpt.manifest
            except (ManifestError, OSError):
                same = False
            if not same or before is None or pinned._marker_now() != before:
                raise pinned._conflict()
            pinned._marker = before
        except BaseException:
            pinned.close()
            raise
        return pinned

    def check(self) -> None:
        """Raise unless the checkpoint's name still holds the pinned directory with the
        marker read: CheckpointNotFoundError if it is gone, StepConflictError if it was
        replaced (another commit) or its marker rewritten (another amend)."""
        self._require_same_dir()
        if self._marker_now() != self._marker:
            raise self._conflict()

    def _require_same_dir(self) -> None:
        try:
            st = os.lstat(self.ckpt.path)
        except FileNotFoundError:
            raise self._gone() from None
        if not os.path.samestat(st, os.fstat(self.fd)):
            raise self._conflict()

    def _marker_now(self) -> tuple[int, ...] | None:
        """The marker's identity: inode, size, and the times a rewrite changes."""
        try:
            st = os.stat(MARKER, dir_fd=self.fd, follow_symlinks=False)
        except OSError:
            return None
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def _conflict(self) -> StepConflictError:
        return StepConflictError(
            f"{self.ckpt.path} was replaced or changed (by another commit or amend) while "
            f"it was being {self._verb}; nothing was committed: look it up again and retry",
            path=self.ckpt.path,
            step=self.ckpt.manifest.step,
        )

    def _gone(self) -> CheckpointNotFoundError:
        return CheckpointNotFoundError(
            f"{self.ckpt.path} was deleted while it was being {self._verb}; nothing was committed",
            path=self.ckpt.path,
            step=self.ckpt.manifest.step,
        )

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


def _require_algorithm(root: Root, base: Checkpoint, staging: Path) -> None:
    """Files written in an amend are hashed with the manifest's algorithm: refuse, before
    anything is hashed, if this Python does not have it (a bare KeyError otherwise)."""
    algorithm = root.checksum
    if algorithm is None or algorithm in CHECKSUMS:
        return
    if next(walk(staging, is_marker_name), None) is None:
        return  # nothing to hash: removing files or changing metadata works
    raise ManifestError(
        f"{base.path}'s manifest records checksums of algorithm {algorithm!r}, which this "
        f"Python does not have (it has {sorted(CHECKSUMS)}), so the files written in the "
        "amend cannot be hashed alike. Install the package providing it, or commit the "
        "step again. Nothing was changed",
        path=base.path,
        step=base.step,
    )


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
    root: Root,
    base: Checkpoint,
    staging: Path,
    written: list[FileEntry],
    gone: set[str],
    *,
    pin: Pinned,
) -> list[FileEntry]:
    """Bring every entry of ``base`` that was neither written anew nor removed into
    ``staging``; return their manifest entries (reused as recorded).

    The files come from the pinned directory, never through a link found inside it.
    A file that is missing, no longer a regular file, or reached through a link raises
    :class:`VerificationError` (the checkpoint changed after its commit), or what
    :meth:`Pinned.check` raises if the checkpoint was replaced or deleted meanwhile.
    """
    new_files = {e.path for e in written if e.type != "dir"}
    out: list[FileEntry] = []
    try:
        marker_ns = os.stat(MARKER, dir_fd=pin.fd, follow_symlinks=False).st_mtime_ns
    except OSError:
        pin.check()  # replaced or deleted meanwhile: say that
        marker_ns = 0  # else no entry is trusted on its identity
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
        elif _carry(base, entry, target, pin):
            root.sync.file(target)  # a copy's data is new: flush it
        out.append(smudged(entry, marker_ns))
    # The directories that received entries: their new entries must be durable
    # before the rename (the staging dir itself is fsynced with the marker).
    for directory in sorted({(staging / e.path).parent for e in out} - {staging}):
        root.sync.subdir(directory)
    return out


_NOT_THERE = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ELOOP})
"""errnos of a path below a checkpoint that is missing or has a link or a file on it."""


def _carry(base: Checkpoint, entry: FileEntry, target: Path, pin: Pinned) -> bool:
    """Link (or copy) one committed file into ``target``; True if it was copied."""
    source = base.path / entry.path
    try:
        return _fs.link_or_copy(source, target, top=base.path, top_fd=pin.fd)
    except OSError as exc:
        if not isinstance(exc, _fs.NotRegularFileError) and exc.errno not in _NOT_THERE:
            raise
        pin.check()  # replaced or deleted meanwhile: say that
        raise VerificationError(
            f"{source} cannot be carried over: "
            + (
                "it is not a regular file any more"
                if isinstance(exc, _fs.NotRegularFileError)
                else "it is missing, or a symlink or a file is on its path (never followed)"
            )
            + f", while its manifest records a file of {entry.size} bytes. The checkpoint "
            "was changed after its commit; run verify() on it. Nothing was committed",
            path=source,
            step=base.step,
            problems=(f"{source}: changed after the commit ({exc.strerror or exc})",),
        ) from exc


def smudged(entry: FileEntry, marker_ns: int) -> FileEntry:
    """``entry`` of a checkpoint whose marker had mtime ``marker_ns``, as the amend's new
    marker records it: without its identity if it was racily clean (written in the tick
    of the commit, :data:`.carry.RACY_NS`), so that a carry still hashes it (git smudges
    such entries when it writes its index anew); as it is otherwise."""
    if entry.checksum is None or entry.mtime_ns is None:  # nothing a carry could hash
        return entry
    if entry.mtime_ns < marker_ns - _carrying.RACY_NS:
        return entry
    return dataclasses.replace(entry, ino=None, mtime_ns=None)


def _rewrite_marker(root: Root, base: Checkpoint, metadata: dict[str, Any]) -> None:
    """Replace ``base``'s marker by one with ``metadata``, atomically and durably.

    Under the root lock, and only if the checkpoint is still the one amended (else a
    concurrent commit won: StepConflictError; or it was deleted: CheckpointNotFoundError;
    nothing written).
    """
    old = base.manifest
    with root.locked():
        try:
            st = os.lstat(base.path)
        except FileNotFoundError:
            raise CheckpointNotFoundError(
                f"{base.path} was deleted while it was being amended; nothing was committed",
                path=base.path,
                step=base.step,
            ) from None
        # Never through a link: a step replaced by a symlink is not the one amended.
        now = classify(base.path, base.step) if stat.S_ISDIR(st.st_mode) else None
        if now is None or now.manifest != old:
            raise StepConflictError(
                f"{base.path} changed while it was being amended; amend it again",
                path=base.path,
                step=base.step,
            )
        marker_ns = os.stat(base.path / MARKER, follow_symlinks=False).st_mtime_ns
        manifest = Manifest(
            step=old.step,
            files=[smudged(e, marker_ns) for e in old.files],
            created=old.created,
            library_version=old.library_version,
            checksum=old.checksum,
            metadata=metadata,
        )
        tmp = base.path / (MARKER_TMP_PREFIX + new_token())
        root.sync.marker(base.path, manifest.to_bytes(), tmp=tmp)
        root.sync.staging(base.path)
