"""The commit protocol: :class:`Commit`, made by :func:`.begin.begin` (steps 1-2),
with :meth:`Commit.publish` (steps 3-7) and :meth:`Commit.abort`. (Adopting a directory in
place is :mod:`._adopt`.)

:meth:`Commit._protocol` reads top to bottom exactly as ``PROTOCOL.md``
numbers the steps. Which fsyncs reach the disk is the root's
:class:`~atomic_ckpt.SyncPolicy`'s business, so the order is all there is here.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from atomic_ckpt._core.l1_names.errors import (
    CommitStateError,
    NotDurableError,
    StagingLostError,
    disk_full,
    looks_full,
)
from atomic_ckpt._core.l1_names.names import is_marker_name
from atomic_ckpt._core.l2_syscalls import fs as _fs
from atomic_ckpt._core.l2_syscalls import locks as _locks
from atomic_ckpt._core.l3_formats.manifest import FileEntry, Manifest, check_metadata
from atomic_ckpt._core.l3_formats.read import Checkpoint
from atomic_ckpt._core.l3_formats.tree import Identity, sync_tree
from atomic_ckpt._core.l4_protocol import carry as _carry
from atomic_ckpt._core.l4_protocol import dedup as _dedup
from atomic_ckpt._core.l4_protocol import delete as _delete
from atomic_ckpt._core.l4_protocol import joining as _joining
from atomic_ckpt._core.l4_protocol import repair as _repair
from atomic_ckpt._core.l4_protocol import stage as _stage
from atomic_ckpt._core.l4_protocol.joining import JOIN_TIMEOUT, JoinedBlocks, check_own_aliases
from atomic_ckpt._core.l4_protocol.retention import RetentionPolicy
from atomic_ckpt._core.l4_protocol.root import Root
from atomic_ckpt._version import __version__

log = logging.getLogger(__name__)

State = Literal["open", "published", "aborted"]


class Commit(JoinedBlocks):
    """One commit in progress: a staging directory that :meth:`publish` promotes to the
    step's directory, atomically and durably, or :meth:`abort` removes.

    Made by :meth:`CheckpointDir.begin <atomic_ckpt.CheckpointDir.begin>`, for code that
    cannot wrap its save in a ``with`` block (a storage writer, a multi-rank or an
    asynchronous save). Used as a context manager it publishes on a normal exit and
    aborts on an exception. :meth:`abort` is idempotent and a no-op after
    :meth:`publish`, so it is safe in a ``finally``. Only the process that began a
    commit can end it: in a child forked meanwhile, :meth:`publish` raises
    :class:`~atomic_ckpt.CommitStateError` and :meth:`abort` does nothing.

    Blocks that join it (``commit(step, join=True)``, in this thread or another) are
    part of it: :meth:`publish` first waits until every joined block has ended (at most
    :attr:`join_timeout` seconds, then it aborts the commit with CommitStateError; at
    once if the publishing thread is itself inside one), and an error leaving a joined
    block aborts the commit, so its :meth:`publish` raises CommitStateError chained
    from that error. Once publishing has begun, a new join is refused.
    """

    def __init__(
        self,
        root: Root,
        step: int | None,
        name: str,
        staging: Path,
        lock: _locks.Lock,
        *,
        metadata: dict[str, Any],
        retain: RetentionPolicy | None,
        aliases: list[str],
        replace_aliases: bool = False,
        dedup: _dedup.Dedup = False,
    ) -> None:
        self._root = root
        self._lock = lock
        self._pid = os.getpid()
        self._state: State = "open"
        self._promoted = False
        self._old: Path | None = None
        self._checkpoint: Checkpoint | None = None
        self._precondition: Callable[[], None] | None = None
        """Run under the root lock just before the promotion; raises to stop it (an amend
        checks there that the version it carries files from is still the step's)."""
        self._step = step
        self.join_timeout = JOIN_TIMEOUT
        """Seconds :meth:`publish` waits for blocks joined from other threads to end."""
        self._cond = threading.Condition()
        self._joiners: dict[int, int] = {}  # thread id -> its open joined blocks
        self._sealed = False  # publishing began: no new join
        self._why: BaseException | None = None  # the error that ended a joined block
        self.name = name
        """The directory name it is committed under (the step's, or the checkpoint's name)."""
        self.path = staging
        """The staging directory: write the checkpoint's files here."""
        self.final = root.path / name
        """Where the checkpoint appears once published."""
        self.metadata = metadata
        """The manifest's metadata: a dict that may change until :meth:`publish`."""
        self.retain = retain
        """A retention policy applied once the commit is durable, or None."""
        self.aliases = aliases
        """Symlinks in the root that will name the checkpoint (replaced with the promotion)."""
        self.replace_aliases = replace_aliases
        """Whether :attr:`aliases` become the checkpoint's only aliases: the ones naming
        it before (an older save of the step) go with the promotion."""
        # Holding the staging dir open pins its identity (its inode cannot be reused),
        # so a save that deletes it and makes a new one is always noticed.
        self._fd: int | None = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._pending: list[_carry.Pending] = []  # carries waiting for the publish
        self._carried: dict[str, tuple[FileEntry, Identity]] = {}
        """Files carried in and placed at the publish: their entries, not hashed again."""
        self.dedup = dedup
        """At :meth:`publish`, link the files equal to a previous checkpoint's (``dedup=``)."""
        self.deduped: dict[str, Literal["reflink", "hardlink"]] = {}
        """Once published: the files :attr:`dedup` linked (relative path -> how)."""
        self._block: int | None = None  # the thread whose with block it is, if any
        self._opener = threading.get_ident()  # the thread that began it
        _joining.register(self)

    def __repr__(self) -> str:
        return f"Commit({self.name!r}, path={str(self.path)!r}, state={self._state!r})"

    @property
    def step(self) -> int:
        """The step being committed (CommitStateError for a named checkpoint's commit)."""
        if self._step is None:
            raise CommitStateError(f"the commit of {self.name!r} is a named one: it has no step")
        return self._step

    @property
    def state(self) -> State:
        """``open``, ``published`` or ``aborted``."""
        return self._state

    def carry(
        self, relpath: str | os.PathLike[str], *, from_: int | str
    ) -> Literal["reflink", "hardlink", "copy"]:
        """Put the committed file or subtree ``relpath`` (``"tokenizer/"``) of the
        checkpoint ``from_`` (a step, or a named checkpoint's name) into this commit
        without writing its data again; return how: ``"reflink"``, ``"hardlink"`` or
        ``"copy"`` (for a subtree, the least shared of its files).

        Its manifest entries are reused once the source is known to be the file its
        manifest describes (else its bytes are hashed: :class:`~atomic_ckpt.VerificationError`
        if they differ). ``relpath`` must not be in the staging dir nor carried yet, and
        its parents there must be real directories (NotADirectoryError: a link is never
        followed). A refused carry changes nothing. Carried files reach their names at
        :meth:`publish`, after the block's writes, which so never reach the source: a name
        the block wrote keeps the block's file (the carried one is dropped, logged)."""
        with self._adding("carry into"):  # a publish begun meanwhile waits for it
            return _carry.carry(self._root, self.path, self._pending, relpath, from_)

    def publish(self, files: list[FileEntry] | None = None) -> Checkpoint:
        """Make the staging directory durable and promote it; return the new checkpoint.

        ``files``: the manifest entries, when the caller has already fsynced (and
        hashed) every file itself (a multi-rank commit); by default the tree is
        walked, fsynced and hashed here. On failure the staging directory is
        removed (nothing else is touched) and the error propagates. Calling it
        again after it succeeded returns the same checkpoint.
        """
        if self._state == "published" and self._checkpoint is not None:
            return self._checkpoint
        if self._step is None:
            raise CommitStateError(
                f"the commit of {self.name!r} is a named one (begin_named): end it with "
                "finish(), which returns its manifest; publish() returns a numbered "
                "step's Checkpoint, which a named one has no step for",
                path=self.path,
            )
        manifest = self.finish(files)
        checkpoint = self._checkpoint = Checkpoint(self.step, self.final, manifest)
        return checkpoint

    def finish(self, files: list[FileEntry] | None = None) -> Manifest:
        """:meth:`publish` for any commit (named ones too); returns the manifest written."""
        self.seal()
        try:
            check_own_aliases(self.name, self.aliases)
            self._check_staging()
            _stage.check_marker_free(self.path)
            metadata = check_metadata(self.metadata)
            manifest = self._protocol(files, metadata)
        except BaseException as exc:
            self._fail(exc)
            self._raise_disk_full(exc)
            raise
        self._state = "published"
        if self.retain is not None:
            try:
                _delete.retain(self._root, self.retain)
            except BaseException as exc:
                exc.add_note(
                    f"atomic_ckpt: {self.name} was committed and is durable; only "
                    "applying the retention policy failed"
                )
                raise
        return manifest

    def _protocol(self, files: list[FileEntry] | None, metadata: dict[str, Any]) -> Manifest:
        """The commit protocol, PROTOCOL.md steps 3 to 7, in order."""
        root, sync, staging, final = self._root, self._root.sync, self.path, self.final
        written: list[Manifest] = []

        def write_marker(entries: list[FileEntry]) -> None:
            entries = _dedup.apply(root, self, entries) if self.dedup is not False else entries
            # 4. The marker: the manifest, its data fsynced (written in place: nothing
            #    in a staging dir is visible before the rename); then fsync the staging
            #    dir, which makes every entry of it durable, the marker's among them.
            manifest = Manifest(
                step=self._step,
                files=tuple(entries),
                created=time.time(),
                library_version=__version__,
                checksum=root.checksum,
                metadata=metadata,
            )
            sync.marker(staging, manifest.to_bytes(), tmp=None)
            sync.staging(staging)
            written.append(manifest)

        # 2b. Carried files go to their names, now that the block's writes are done.
        _carry.place(staging, self._fd, self._pending, self._carried, walk=files is None)
        # 3. fsync every regular file and subdirectory of the tree, hashing the files;
        #    step 4 runs as soon as the checksums are known, while the flushes may still
        #    be in flight (the rename waits for both). A multi-rank commit passes
        #    ``files``: its ranks have done step 3 for what each wrote.
        if files is None:
            sync_tree(
                staging,
                policy=sync,
                checksum=root.checksum,
                workers=root.workers,
                skip=is_marker_name,
                then=write_marker,
                mapped=True,  # the caller's own files, written before the block ended
                known=self._carried,
            )
        else:
            write_marker(files)
        (manifest,) = written
        # 5. Promote, under the root lock: rename (a new step) or exchange (a replace).
        with root.locked():
            _repair.restore_asides(root)
            if self._precondition is not None:
                self._precondition()
            _stage.check_target(final, self._step)
            _delete.check_aliases_free(root, self.aliases)  # before anything changes
            if self.replace_aliases:
                # Aliases of the older save that this one drops go first, durably: none
                # may name the new contents, and none may dangle.
                _delete.drop_aliases(root, final.name, keep=self.aliases)
            old = self._old = _stage.promote(root, staging, final)
            self._promoted = True
            # 6. fsync the root: the rename durable; then the aliases follow it, fsynced
            #    again (a crash between leaves an alias missing or naming this step's older
            #    save, never dangling nor naming the new one before it is there, in
            #    whatever order the filesystem keeps a directory's changes).
            for aliases in ([], self.aliases) if self.aliases else ([],):
                _delete.point_aliases(root, aliases, final.name)
                try:
                    sync.root(root.path)
                except OSError as exc:
                    raise NotDurableError(
                        f"checkpoint {final} was promoted and is visible, but fsync of "
                        f"{root.path} failed ({exc}): it may not survive a power loss. "
                        + (f"The old copy is kept at {old} for clean(). " if old else "")
                        + "Check the disk, then commit this step again",
                        path=final,
                        step=self._step,
                    ) from exc
        # 7. Remove the old copy, if any: it sits under a name the scanner ignores.
        if old is not None:
            try:
                _fs.remove_tree(old)
            except OSError as exc:
                log.warning("could not remove old copy %s (%s); clean() will", old, exc)
        try:
            self._close(leaving=old)
        except OSError as exc:
            # The root fsync returned, but the filesystem fails the next call: some
            # (xfs after a forced shutdown) report success for an fsync they could
            # not make durable. Say so rather than claim durability.
            raise NotDurableError(
                f"checkpoint {final} was promoted, but the filesystem failed right after "
                f"({exc}): it may not survive a power loss. Check the disk, then commit "
                "this step again",
                path=final,
                step=self._step,
            ) from exc
        return manifest

    def abort(self, exc: BaseException | None = None) -> None:
        """Give the commit up: remove the staging directory, touch nothing else.

        A no-op once the commit was published or aborted, or in a process other
        than the one that began it. A failure to clean up is attached to ``exc``
        as a note when given (never raised instead of it), else raised.
        """
        if os.getpid() != self._pid:
            return
        with self._cond:
            if self._state != "open":
                return
            self._state = "aborted"  # claimed here: a second abort does nothing
        carrier = exc if exc is not None else CommitStateError("aborted", step=self._step)
        self._fail(carrier)
        notes = getattr(carrier, "__notes__", None)
        if exc is None and notes:
            raise OSError(errno.EIO, "; ".join(notes), str(self.path))

    def __enter__(self) -> Commit:
        self.as_block()
        return self

    def as_block(self) -> None:
        """Mark it the commit of a ``with`` block of this thread: a second commit of its
        name begun in this thread while it is open is refused (it would be nested in it)."""
        self._block = threading.get_ident()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if os.getpid() != self._pid:
            if exc is None:
                self._require_open("publish")  # raises: a forked child
            return  # the child's exception propagates; the parent's commit is untouched
        if exc is None:
            self.finish() if self._step is None else self.publish()
        else:
            self.abort(exc)
            self._raise_disk_full(exc)

    def _raise_disk_full(self, exc: BaseException) -> None:
        """DiskFullError from ``exc`` if it is the disk (or quota) filling up (a serializer's
        own error too: see :func:`looks_full`); else nothing."""
        what = f"the commit of {self.name}"  # _full: set when _fail() ended the commit
        full = disk_full(exc, self._root.path, what, code=getattr(self, "_full", None))
        if full is not None:
            full.step = self._step
            for note in getattr(exc, "__notes__", ()):  # a cleanup failure stays visible
                full.add_note(note)
            raise full from exc

    # ------------------------------------------------------------------ internals

    def _require_open(self, what: str) -> None:
        if os.getpid() != self._pid:
            raise CommitStateError(
                f"cannot {what} the commit of {self.name}: it belongs to process "
                f"{self._pid}, and this is process {os.getpid()} (forked inside the commit). "
                "Only the process that began a commit may publish or abort it; "
                "end a forked child with os._exit()",
                path=self.path,
                step=self._step,
            )
        if self._state != "open":
            if self._why is not None:  # a full disk says so, and what to do, here too
                why = disk_full(self._why, self._root.path, f"the commit of {self.name}")
                raise CommitStateError(
                    f"cannot {what} the commit of {self.name}: a block that joined it failed "
                    f"({type(why or self._why).__name__}: {why or self._why}), which aborted "
                    "it. Nothing was published; fix that error and save again",
                    path=self.path,
                    step=self._step,
                ) from self._why
            raise CommitStateError(
                f"cannot {what} the commit of {self.name}: it was already {self._state}",
                path=self.path,
                step=self._step,
            )

    def _check_staging(self) -> None:
        try:
            st: os.stat_result | None = os.lstat(self.path)
        except FileNotFoundError:
            st = None
        assert self._fd is not None
        if (
            st is None
            or not stat.S_ISDIR(st.st_mode)
            or not os.path.samestat(st, os.fstat(self._fd))
        ):
            raise StagingLostError(
                f"the staging directory {self.path} was removed or replaced during the save; "
                "the save function must write inside it, not move or delete it. "
                "Nothing was committed",
                path=self.path,
                step=self._step,
            )

    def _fail(self, exc: BaseException) -> None:
        """End a failed commit: remove what it left unless that must stay for clean().

        A cleanup failure is attached to ``exc`` as a note, never raised instead of it,
        and the staging dir's descriptor and lock are released whatever happens.
        """
        self._state = "aborted"
        leaving: Path | None = self.path
        self._full = looks_full(exc, self.path)  # before what filled the disk is removed
        try:
            if self._promoted:
                # Promoted, then the root fsync failed (or was interrupted): the new one is
                # visible; the old copy stays for clean() (maybe the only durable copy).
                leaving = self._old
                if not isinstance(exc, NotDurableError):  # Ctrl-C: that one says so itself
                    why = "but may not survive a power loss (interrupted before its fsync)"
                    exc.add_note(f"atomic_ckpt: {self.final} was promoted and is visible, {why}")
            elif not _repair.in_fallback_window(self._root, self.path):
                _fs.remove_tree(self.path)
        except Exception as cleanup:
            exc.add_note(f"atomic_ckpt: removing {self.path} also failed: {cleanup!r}")
        finally:
            try:
                self._close(leaving=leaving)
            except Exception as cleanup:
                exc.add_note(f"atomic_ckpt: removing {self._lock.path} also failed: {cleanup!r}")

    def _close(self, *, leaving: Path | None) -> None:
        """Close the pinned staging dir and release the staging lock; its file stays
        while ``leaving`` is left behind without a manifest (the evidence for clean())."""
        _joining.unregister(self)
        fd, self._fd = self._fd, None
        try:
            if fd is not None:
                os.close(fd)
        finally:
            if leaving is None:
                self._lock.release(remove=True)
            else:
                _delete.release_leaving(self._lock, leaving)
