"""The commit protocol: :func:`begin` (steps 1-2), :meth:`Commit.publish` (steps 3-7)
and :meth:`Commit.abort`. (Adopting a directory in place is :mod:`._adopt`.)

:meth:`Commit._protocol` reads top to bottom exactly as ``PROTOCOL.md``
numbers the steps. Which fsyncs reach the disk is the root's
:class:`~atomic_ckpt.SyncPolicy`'s business, so the order is all there is here.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, SupportsIndex

from . import _fs, _locks, _repair
from ._errors import (
    CommitStateError,
    NotDurableError,
    StagingLostError,
    StepConflictError,
)
from ._manifest import FileEntry, Manifest, check_metadata
from ._names import (
    TAG_OLD,
    is_marker_name,
    lock_name,
    new_token,
    parse_tmp,
    tmp_name,
)
from ._read import Checkpoint
from ._retention import RetentionPolicy
from ._root import Root, check_step
from ._tree import sync_tree
from ._version import __version__

log = logging.getLogger(__name__)

State = Literal["open", "published", "aborted"]


class Commit:
    """One commit in progress: a staging directory that :meth:`publish` promotes to the
    step's directory, atomically and durably, or :meth:`abort` removes.

    Made by :meth:`CheckpointDir.begin <atomic_ckpt.CheckpointDir.begin>`, for code that
    cannot wrap its save in a ``with`` block (a storage writer, a multi-rank or an
    asynchronous save). Used as a context manager it publishes on a normal exit and
    aborts on an exception. :meth:`abort` is idempotent and a no-op after
    :meth:`publish`, so it is safe in a ``finally``. Only the process that began a
    commit can end it: in a child forked meanwhile, :meth:`publish` raises
    :class:`~atomic_ckpt.CommitStateError` and :meth:`abort` does nothing.
    """

    def __init__(
        self,
        root: Root,
        step: int,
        staging: Path,
        lock: _locks.Lock,
        *,
        metadata: dict[str, Any],
        retain: RetentionPolicy | None,
    ) -> None:
        self._root = root
        self._lock = lock
        self._pid = os.getpid()
        self._state: State = "open"
        self._promoted = False
        self._old: Path | None = None
        self._checkpoint: Checkpoint | None = None
        self.step = step
        """The step being committed (an ``int``)."""
        self.path = staging
        """The staging directory: write the checkpoint's files here."""
        self.final = root.path / root.name_of(step)
        """Where the checkpoint appears once published."""
        self.metadata = metadata
        """The manifest's metadata: a dict that may change until :meth:`publish`."""
        self.retain = retain
        """A retention policy applied once the commit is durable, or None."""
        # Holding the staging dir open pins its identity (its inode cannot be reused),
        # so a save that deletes it and makes a new one is always noticed.
        self._fd: int | None = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def __repr__(self) -> str:
        return f"Commit(step={self.step}, path={str(self.path)!r}, state={self._state!r})"

    @property
    def state(self) -> State:
        """``open``, ``published`` or ``aborted``."""
        return self._state

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
        self._require_open("publish")
        try:
            self._check_staging()
            metadata = check_metadata(self.metadata)
            checkpoint = self._protocol(files, metadata)
        except BaseException as exc:
            self._fail(exc)
            raise
        self._state = "published"
        self._checkpoint = checkpoint
        if self.retain is not None:
            try:
                _repair.retain(self._root, self.retain)
            except BaseException as exc:
                exc.add_note(
                    f"atomic_ckpt: step {self.step} was committed and is durable; only "
                    "applying the retention policy failed"
                )
                raise
        return checkpoint

    def _protocol(self, files: list[FileEntry] | None, metadata: dict[str, Any]) -> Checkpoint:
        """The commit protocol, PROTOCOL.md steps 3 to 7, in order."""
        root, sync, staging, final = self._root, self._root.sync, self.path, self.final
        # 3. fsync every regular file and subdirectory of the tree. (The staging dir
        #    itself is fsynced once, after the marker is in place: that one fsync makes
        #    every entry of it durable.) A multi-rank commit passes ``files``: its ranks
        #    have done this step for what each wrote.
        if files is None:
            files = sync_tree(
                staging,
                policy=sync,
                checksum=root.checksum,
                workers=root.workers,
                skip=is_marker_name,
            )
        # 4. The marker: the manifest, its data fsynced (written in place: nothing in
        #    a staging dir is visible before the rename); then fsync the staging dir.
        manifest = Manifest(
            step=self.step,
            files=tuple(files),
            created=time.time(),
            library_version=__version__,
            checksum=root.checksum,
            metadata=metadata,
        )
        sync.marker(staging, manifest.to_bytes(), tmp=None)
        sync.staging(staging)
        # 5. Promote, under the root lock: rename (a new step) or exchange (a replace).
        with root.locked():
            _repair.restore_asides(root)
            check_target(final, self.step)
            old = self._old = promote(root, staging, final)
            self._promoted = True
            # 6. fsync the root: this makes the rename itself durable.
            try:
                sync.root(root.path)
            except OSError as exc:
                raise NotDurableError(
                    f"checkpoint {final} was promoted and is visible, but fsync of "
                    f"{root.path} failed ({exc}): it may not survive a power loss. "
                    + (f"The old copy is kept at {old} for clean(). " if old else "")
                    + "Check the disk, then commit this step again",
                    path=final,
                    step=self.step,
                ) from exc
        # 7. Remove the old copy, if any: it sits under a name the scanner ignores.
        if old is not None:
            try:
                _fs.remove_tree(old)
            except OSError as exc:
                log.warning("could not remove old copy %s (%s); clean() will", old, exc)
        self._close(leaving=old)
        return Checkpoint(self.step, final, manifest)

    def abort(self, exc: BaseException | None = None) -> None:
        """Give the commit up: remove the staging directory, touch nothing else.

        A no-op once the commit was published or aborted, or in a process other
        than the one that began it. A failure to clean up is attached to ``exc``
        as a note when given (never raised instead of it), else raised.
        """
        if self._state != "open" or os.getpid() != self._pid:
            return
        carrier = exc if exc is not None else CommitStateError("aborted", step=self.step)
        self._fail(carrier)
        notes = getattr(carrier, "__notes__", None)
        if exc is None and notes:
            raise OSError(errno.EIO, "; ".join(notes), str(self.path))

    def __enter__(self) -> Commit:
        return self

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
            self.publish()
        else:
            self.abort(exc)

    # ------------------------------------------------------------------ internals

    def _require_open(self, what: str) -> None:
        if os.getpid() != self._pid:
            raise CommitStateError(
                f"cannot {what} the commit of step {self.step}: it belongs to process "
                f"{self._pid}, and this is process {os.getpid()} (forked inside the commit). "
                "Only the process that began a commit may publish or abort it; "
                "end a forked child with os._exit()",
                path=self.path,
                step=self.step,
            )
        if self._state != "open":
            raise CommitStateError(
                f"cannot {what} the commit of step {self.step}: it was already {self._state}",
                path=self.path,
                step=self.step,
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
                step=self.step,
            )

    def _fail(self, exc: BaseException) -> None:
        """End a failed commit: remove what it left unless that must stay for clean().

        A cleanup failure is attached to ``exc`` as a note, never raised instead of it,
        and the staging dir's descriptor and lock are released whatever happens.
        """
        self._state = "aborted"
        leaving: Path | None = self.path
        try:
            if self._promoted:
                # Promoted, then the root fsync failed: the new checkpoint is visible,
                # and the old copy (if any) stays under its .tmp- name for clean(); it
                # may be the only durable copy.
                leaving = self._old
            elif not self._in_fallback_window():
                _fs.remove_tree(self.path)
        except Exception as cleanup:
            exc.add_note(f"atomic_ckpt: removing {self.path} also failed: {cleanup!r}")
        finally:
            try:
                self._close(leaving=leaving)
            except Exception as cleanup:
                exc.add_note(f"atomic_ckpt: removing {self._lock.path} also failed: {cleanup!r}")

    def _in_fallback_window(self) -> bool:
        """Did a fallback replace fail to move its old copy back? Then the staging dir is
        what tells clean() that the old copy must be restored: it stays."""
        tmp = parse_tmp(self.path.name)
        assert tmp is not None
        base = self._root.path
        aside = base / tmp_name(tmp.name, tmp.token, TAG_OLD)
        return os.path.isdir(aside) and not os.path.lexists(base / tmp.name)

    def _close(self, *, leaving: Path | None) -> None:
        """Close the pinned staging dir and release the staging lock; its file stays
        while ``leaving`` is left behind without a manifest (the evidence for clean())."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
        if leaving is None:
            self._lock.release(remove=True)
        else:
            _repair.release_leaving(self._lock, leaving)


def begin(
    root: Root,
    step: SupportsIndex,
    *,
    metadata: object = None,
    retain: RetentionPolicy | None = None,
) -> Commit:
    """Steps 1 and 2 of the protocol: take a staging lock, create the staging dir."""
    step = check_step(step)
    name = root.name_of(step)
    meta = check_metadata(metadata)
    root.ensure()
    final = root.path / name
    check_target(final, step)
    # 1. The staging lock first, then the directory: clean() never sees a live
    #    save unlocked. (A cleaner that claims the lock file in the instant before
    #    we lock it deletes it; create() notices and we take another token.)
    lock: _locks.Lock | None = None
    while lock is None:
        token = new_token()
        try:
            lock = _locks.create(root.path / lock_name(name, token))
        except OSError as exc:
            raise root.wrap(exc) from exc
    staging = root.path / tmp_name(name, token)
    try:
        _fs.mkdir(staging)  # 0o777 & ~umask, like any mkdir
        return Commit(root, step, staging, lock, metadata=meta, retain=retain)
    except BaseException as exc:
        lock.release(remove=True)
        if isinstance(exc, OSError):
            raise root.wrap(exc) from exc
        raise


def check_target(final: Path, step: int) -> None:
    """Refuse a step whose name is taken by something that is not a directory."""
    try:
        st = os.lstat(final)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a directory"
        raise StepConflictError(
            f"{final} exists and is {kind}, so step {step} cannot be committed there; "
            "move it away first",
            path=final,
            step=step,
        )


def promote(root: Root, staging: Path, final: Path) -> Path | None:
    """Step 5: move ``staging`` to ``final``; return where the old copy went, if any."""
    try:
        _fs.rename_noreplace(staging, final)
        return None
    except FileExistsError:
        pass
    except OSError as exc:
        if exc.errno != errno.ENOTEMPTY:
            raise
    try:
        _fs.rename_exchange(staging, final)
        return staging
    except OSError as exc:
        if exc.errno not in _fs.EXCHANGE_UNSUPPORTED:
            raise
        log.info("RENAME_EXCHANGE unsupported here (%s); replacing by moving aside", exc)
    # The fallback: move the old copy aside under a .tmp-old- name, then promote.
    # Between the two renames there is no N/; a crash there leaves the aside copy
    # *and* this staging dir, which is how clean() knows to rename the old copy back
    # (see _repair.is_restorable).
    tmp = parse_tmp(staging.name)
    assert tmp is not None
    aside = root.path / tmp_name(final.name, tmp.token, TAG_OLD)
    # The staging dir's entry must be durable before the old copy moves: without it,
    # a power loss could keep the move and lose the staging dir, and the old copy
    # would not be recognized as restorable.
    root.sync.root(root.path)
    _fs.rename(final, aside)
    try:
        _fs.rename_noreplace(staging, final)
    except BaseException as exc:
        try:
            _fs.rename(aside, final)
        except OSError as undo:
            exc.add_note(
                f"atomic_ckpt: moving the old copy back to {final} also failed ({undo!r}); "
                f"it is intact at {aside}, and clean() renames it back"
            )
        raise
    return aside
