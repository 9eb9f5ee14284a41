"""``RemoteCommit``: one commit in progress, a local staging directory that ``publish()``
uploads and commits through :func:`._protocol.publish`, or ``abort()`` removes."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, SupportsIndex

from atomic_ckpt import (
    MARKER,
    CheckpointDir,
    CommitStateError,
    FileEntry,
    MarkerIsDirectoryError,
    RetentionPolicy,
)
from atomic_ckpt.remote import _protocol
from atomic_ckpt.remote._protocol import RemoteCheckpoint
from atomic_ckpt.remote._store import Store


class CommitTarget(Protocol):
    """What a commit calls back into: the root it commits to (``RemoteCheckpointDir``).

    Named here as a protocol so that the facade imports its commit handle and not the reverse.
    """

    _local: CheckpointDir
    _store: Store
    _checksum: str | None

    @property
    def staging_dir(self) -> Path: ...

    def url_of(self, step: SupportsIndex) -> str: ...

    def _name(self, step: int) -> str: ...

    def retain(self, policy: RetentionPolicy | None = None) -> list[str]: ...


class RemoteCommit:
    """One commit in progress: ``path`` is its local staging directory.

    ``publish()`` uploads and commits; ``abort()`` gives up. As a context manager,
    a normal exit publishes and an exception aborts. Only the process that began the
    commit can end it: in a child forked meanwhile, ``publish()`` raises
    :class:`~atomic_ckpt.CommitStateError`, and ``abort()`` (or an exception leaving the
    block) leaves the parent's staging directory alone.
    """

    def __init__(
        self,
        rdir: CommitTarget,
        step: int,
        metadata: dict[str, Any],
        base: str | None,
        retain: RetentionPolicy | None = None,
        *,
        old_attempt: str | None = None,
    ) -> None:
        self._retain = retain
        self._old_attempt = old_attempt
        self._rdir = rdir
        self.step = step
        self.attempt = uuid.uuid4().hex
        self._metadata = metadata
        self._base = base
        parent = rdir.staging_dir
        parent.mkdir(parents=True, exist_ok=True)
        self.path = parent / f"atomic_ckpt-{step}.tmp-{self.attempt}"
        self.path.mkdir()
        self._done = False
        self._pid = os.getpid()

    def __repr__(self) -> str:
        return f"RemoteCommit({self._rdir.url_of(self.step)!r}, path={str(self.path)!r})"

    def publish(self) -> RemoteCheckpoint:
        """Upload the staging directory's files and commit them; remove the staging dir."""
        try:
            done = self._publish_from(self.path)
        finally:
            self.abort()
        if self._retain is not None:
            self._rdir.retain(self._retain)
        return done

    def _publish_from(self, directory: Path) -> RemoteCheckpoint:
        self._require_owner()
        if self._done:
            raise CommitStateError("this commit was already published or aborted")
        self._done = True
        rdir = self._rdir
        marker = directory / MARKER
        if marker.is_dir() and not marker.is_symlink():  # the walk would leave it out, silently
            raise MarkerIsDirectoryError(
                f"the save wrote a directory named {MARKER} in {directory}: that name is "
                "reserved for atomic_ckpt's marker file. Nothing was uploaded; give the "
                "directory another name in the save",
                path=marker,
                step=self.step,
            )
        entries: list[FileEntry] = rdir._local.sync_tree(directory)
        done = _protocol.publish(
            rdir._store,
            name=rdir._name(self.step),
            step=self.step,
            staging=directory,
            entries=entries,
            attempt=self.attempt,
            base_etag=self._base,
            checksum=rdir._checksum,
            metadata=self._metadata,
        )
        if self._old_attempt is not None:  # replaced: the old attempt is garbage now
            name = rdir._name(self.step)
            _protocol.discard(rdir._store, _protocol.data_prefix(name, self._old_attempt))
        return done

    def abort(self) -> None:
        """Give up (nothing was uploaded yet) or clean up after publishing; in a forked
        child, nothing (the staging directory is the parent's)."""
        if os.getpid() != self._pid:
            return
        self._done = True
        shutil.rmtree(self.path, ignore_errors=True)

    def __enter__(self) -> RemoteCommit:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.publish()
        else:
            self.abort()

    def _require_owner(self) -> None:
        if os.getpid() != self._pid:
            raise CommitStateError(
                f"cannot publish the commit of {self._rdir.url_of(self.step)}: it belongs to "
                f"process {self._pid}, and this is process {os.getpid()} (forked inside the "
                "commit). Only the process that began a commit may publish it; end a forked "
                "child with os._exit()",
                path=self.path,
                step=self.step,
            )
