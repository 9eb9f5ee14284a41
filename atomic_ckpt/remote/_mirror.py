"""Uploading in the background: an AsyncCommitter over a remote root, and a Mirror that
commits locally (the only wait) and copies each checkpoint to the remote behind it."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple, SupportsIndex

from atomic_ckpt import (
    MARKER,
    AsyncCommitter,
    Checkpoint,
    CheckpointDir,
    CheckpointError,
    CommitterClosedError,
    RetentionPolicy,
    StepConflictError,
)
from atomic_ckpt._core.l5_facade.closing import ClosesOnExit
from atomic_ckpt.remote._dir import RemoteCheckpointDir
from atomic_ckpt.remote._protocol import RemoteCheckpoint

log = logging.getLogger(__name__)


class AsyncRemoteCommitter(AsyncCommitter):
    """:class:`~atomic_ckpt.AsyncCommitter` over a remote root: ``save(step, state)``
    copies the state (or takes a save function), and a background thread writes it
    into a local staging directory and commits it to the store. Errors surface on the
    next ``save``, ``wait`` or ``close``, as there. ``writer(state, directory)`` writes a
    copied state (default: ``torch.save`` to ``state.pt``)."""

    def __init__(
        self,
        remote: RemoteCheckpointDir,
        *,
        writer: Callable[[Any, Path], None] | None = None,
        retain: RetentionPolicy | None = None,
    ) -> None:
        kwargs: dict[str, Any] = {"retain": retain}
        if writer is not None:
            kwargs["writer"] = writer
        # AsyncCommitter needs begin(step, metadata=, retain=) -> a handle with .path
        # used as a context manager: RemoteCheckpointDir has exactly that.
        super().__init__(remote, **kwargs)  # type: ignore[arg-type]


class Mirror(ClosesOnExit):
    """Commit to a local :class:`~atomic_ckpt.CheckpointDir`, then mirror to a remote root.

    ::

        mirror = Mirror(CheckpointDir("/nvme/ckpts"), RemoteCheckpointDir("s3://b/run"))
        with mirror.commit(step) as path:   # blocks for the local commit only
            save(path)
        ...
        mirror.close()                      # waits for the last upload, raises its error

    After each local commit the checkpoint is snapshotted (hard links, or copies across
    filesystems, in ``snapshot_dir``: default the remote's staging directory) so local
    pruning cannot pull files from under the upload, and queued. A step another writer
    replaces during the snapshot is snapshotted again (never uploaded as a mix of two
    saves; after 3 tries, a ``CheckpointError`` that is also a ``RuntimeError``); one
    deleted meanwhile is ``CheckpointNotFoundError``. One upload runs at a time; a step
    queued while an older one still waits replaces it (the remote gets the newest). The
    remote only ever shows complete steps: each upload is an ordinary remote commit. A
    failed upload is raised by the next ``commit``, ``mirror``, ``wait`` or ``close``
    (before any new work starts); one that nothing raised makes the process exit with
    status 1, naming the step the remote lacks. ``retain`` is applied to the remote
    after each upload.

    An upload over a remote step that holds a checkpoint this release must not lose (a
    newer release's, or one copied there from another step) is refused, as a remote
    commit is; ``replace_unusable=True`` on :meth:`commit` or :meth:`mirror` replaces it
    knowingly, for that call's step only.
    """

    _closing_what = "the mirror"
    _failure_what = "the mirror upload"

    def __init__(
        self,
        local: CheckpointDir,
        remote: RemoteCheckpointDir,
        *,
        retain: RetentionPolicy | None = None,
        snapshot_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.local = local
        self.remote = remote
        self._retain = retain
        self._snapshot_dir = Path(snapshot_dir) if snapshot_dir else remote.staging_dir
        self._cond = threading.Condition()
        self._pending: _Queued | None = None
        self._current: int | None = None
        self._busy = False
        self._error: BaseException | None = None
        self._closed = False
        self._uploaded: list[RemoteCheckpoint] = []
        self._watch()

    def __repr__(self) -> str:
        return f"Mirror({self.local!r}, {self.remote!r})"

    @property
    def uploaded(self) -> list[RemoteCheckpoint]:
        """The checkpoints mirrored so far, in order."""
        with self._cond:
            return list(self._uploaded)

    @property
    def pending(self) -> int | None:
        """The newest step queued or being uploaded, or None once all are done."""
        with self._cond:
            if self._pending is not None:
                return self._pending[0]
            return self._current

    @contextlib.contextmanager
    def commit(
        self,
        step: SupportsIndex,
        *,
        metadata: Mapping[str, Any] | None = None,
        replace_unusable: bool = False,
    ) -> Iterator[Path]:
        """``local.commit(step)``, then queue the checkpoint for upload. Raises a failed
        upload's error first (and then commits nothing). ``replace_unusable`` as for
        ``CheckpointDir.commit``, for the local commit and the upload both."""
        self._raise_failure(new_work=True)
        with self.local.commit(step, metadata=metadata, replace_unusable=replace_unusable) as path:
            yield path
        self.mirror(step, replace_unusable=replace_unusable)

    def mirror(self, step: SupportsIndex, *, replace_unusable: bool = False) -> None:
        """Queue the local complete checkpoint of ``step`` for upload. ``replace_unusable``
        as for ``RemoteCheckpointDir.upload`` (the refusal is the upload's error, raised by
        the next call)."""
        self._raise_failure(new_work=True)
        ckpt, snapshot = _steady_snapshot(self.local, step, self._snapshot_dir)
        with self._cond:
            if self._pending is not None:
                old = self._pending[0]
                log.info("mirror: step %d superseded by %d before its upload", old, ckpt.step)
                shutil.rmtree(self._pending[1], ignore_errors=True)
            self._pending = _Queued(
                ckpt.step, snapshot, dict(ckpt.manifest.metadata), replace_unusable
            )
            if not self._busy:
                # A thread per burst of work, not one idling forever: nothing keeps the
                # interpreter from exiting once the uploads are done. Not a daemon: an
                # upload in flight at exit is finished, not cut off.
                self._busy = True
                threading.Thread(target=self._work, name="atomic_ckpt-mirror").start()

    def wait(self) -> None:
        """Wait until every queued upload is done; raise a failed one's error."""
        with self._cond:
            while self._busy:
                self._cond.wait()
        self._raise_failure()

    def close(self) -> None:
        """Wait for the queued uploads and refuse new ones; raise a failed upload's error."""
        with self._cond:
            self._closed = True
        self.wait()

    def _join_at_exit(self) -> None:
        with self._cond:
            while self._busy:
                self._cond.wait()

    def _raise_failure(self, *, new_work: bool = False) -> None:
        with self._cond:
            error, self._error = self._error, None
            closed = self._closed
        if error is not None:
            self._observed()
            raise error
        if new_work and closed:
            raise CommitterClosedError("this Mirror is closed; make a new one")

    def _work(self) -> None:
        while True:
            with self._cond:
                if self._pending is None:
                    self._busy = False
                    self._current = None
                    self._cond.notify_all()
                    return
                step, snapshot, metadata, replace = self._pending
                self._pending = None
                self._current = step
            try:
                done = self.remote.upload(
                    step, snapshot, metadata=metadata, replace_unusable=replace
                )
                if self._retain is not None:
                    self.remote.retain(self._retain)
            except BaseException as exc:
                exc.add_note(f"atomic_ckpt: raised by the mirror upload of step {step}")
                # Only for the refusal that names the option, not for a racing writer.
                if isinstance(exc, StepConflictError) and "replace_unusable" in str(exc):
                    exc.add_note(
                        "atomic_ckpt: to replace it knowingly through this Mirror, call "
                        f"mirror.mirror({step}, replace_unusable=True)"
                    )
                log.error("mirror upload of step %d failed: %r", step, exc)
                with self._cond:
                    self._error = exc
                    self._failed(step, exc)
            else:
                with self._cond:
                    self._uploaded.append(done)
            finally:
                shutil.rmtree(snapshot, ignore_errors=True)


class _Queued(NamedTuple):
    """A step waiting for its upload: its snapshot, metadata and the caller's choice."""

    step: int
    snapshot: Path
    metadata: Mapping[str, Any]
    replace_unusable: bool


SNAPSHOT_TRIES = 3
"""How many snapshots of a step :meth:`Mirror.mirror` takes while another writer keeps
replacing it, before it gives up."""


class StepChangedError(CheckpointError, RuntimeError):
    """A local step kept being replaced while a Mirror took its snapshot."""


def _steady_snapshot(
    local: CheckpointDir, step: SupportsIndex, parent: Path
) -> tuple[Checkpoint, Path]:
    """The complete checkpoint of ``step`` and a snapshot holding exactly the files of its
    manifest. The snapshot walks the step path by path, so a writer replacing the step
    meanwhile could leave files of two saves in it (whose remote manifest, computed from
    the snapshot, would verify). So the step's directory is pinned first (held open, as an
    amend pins it), its manifest read, and the snapshot kept only if the step is still
    that directory afterwards (a replaced step never comes back under its name) and holds
    the manifest's files at their sizes; otherwise it is taken again. A step deleted
    meanwhile is CheckpointNotFoundError, as a step missing to begin with."""
    for _ in range(SNAPSHOT_TRIES):
        ckpt = local.get(step)  # CheckpointNotFoundError once the step is gone
        try:
            pin = os.open(ckpt.path, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            continue
        try:
            held = _identity(os.fstat(pin))
            ckpt = local.get(step)  # the manifest of the pinned directory, checked below
            if _identity_of(ckpt.path) != held:
                continue
            try:
                snapshot = _snapshot(ckpt.path, parent)
            except (shutil.Error, FileNotFoundError) as exc:
                # A file or the step vanished under the walk: replaced or deleted. The
                # next get() tells which.
                log.info("mirror: step %d changed during its snapshot (%s)", ckpt.step, exc)
                continue
            if _identity_of(ckpt.path) == held and _matches(snapshot, ckpt):
                return ckpt, snapshot
            shutil.rmtree(snapshot, ignore_errors=True)
            log.info("mirror: step %d was replaced during its snapshot; again", ckpt.step)
        finally:
            os.close(pin)
    raise StepChangedError(
        f"step {ckpt.step} of {local.root} was replaced {SNAPSHOT_TRIES} times while it was "
        "being snapshotted for the upload: nothing was queued; mirror it again once the "
        "other writer of that step is done",
        path=ckpt.path,
        step=ckpt.step,
    )


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _identity_of(path: Path) -> tuple[int, int] | None:
    try:
        return _identity(os.stat(path))
    except FileNotFoundError:
        return None


def _matches(snapshot: Path, ckpt: Checkpoint) -> bool:
    """Whether ``snapshot`` holds the files and links of ``ckpt``'s manifest and no other,
    each file at its size. (Not its inode: the manifest of a fetched or copied checkpoint
    names the inodes of the machine that wrote it.)"""
    listed = {e.path: e for e in ckpt.manifest.files if e.type != "dir"}
    found = {
        p.relative_to(snapshot).as_posix()
        for p in snapshot.rglob("*")
        if p.is_symlink() or not p.is_dir()
    } - {MARKER}
    if found != set(listed):
        return False
    return all(
        os.lstat(snapshot / rel).st_size == entry.size
        for rel, entry in listed.items()
        if entry.type == "file"
    )


def _snapshot(source: Path, parent: Path) -> Path:
    """A private copy of the checkpoint ``source``: hard links where possible."""
    parent.mkdir(parents=True, exist_ok=True)
    dest = parent / f"atomic_ckpt-mirror.tmp-{uuid.uuid4().hex}"

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst, follow_symlinks=False)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                raise
            shutil.copy2(src, dst, follow_symlinks=False)

    try:
        shutil.copytree(source, dest, symlinks=True, copy_function=link)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    return dest
