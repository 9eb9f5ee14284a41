"""``RemoteCheckpointDir``: the facade over one object-store root, mirroring ``CheckpointDir``.

It holds the root's settings and says what each call does; the work is done by
:mod:`._protocol` (reading checkpoints, the commit protocol), :mod:`._commit`
(``RemoteCommit``, a commit in progress), :mod:`._fetch` (downloading and checking),
:mod:`._entries` (every step folder's status) and :mod:`._clean` (deleting, cleanup).
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, SupportsIndex

from atomic_ckpt import (
    Checkpoint,
    CheckpointDir,
    CheckpointNotFoundError,
    Manifest,
    RetentionPolicy,
    VerificationError,
)
from atomic_ckpt._core.l1_names.names import check_prefix
from atomic_ckpt._core.l4_protocol.root import check_step as _check_step  # as a local root
from atomic_ckpt.remote import _clean, _entries, _fetch, _protocol
from atomic_ckpt.remote._commit import RemoteCommit
from atomic_ckpt.remote._entries import RemoteEntry
from atomic_ckpt.remote._open import open_store
from atomic_ckpt.remote._protocol import RemoteCheckpoint
from atomic_ckpt.remote._s3 import MULTIPART_THRESHOLD, PART_SIZE
from atomic_ckpt.remote._store import Store

log = logging.getLogger(__name__)

PathLike = str | os.PathLike[str]

DEFAULT_GRACE = 3600.0
"""Seconds an unreferenced attempt must be left alone before ``clean()`` removes it."""


class RemoteCheckpointDir:
    """Checkpoints in an object store (``s3://bucket/prefix``, ``gs://bucket/prefix``,
    ``az://container/prefix``, ``memory://name``), one folder per step, committed
    atomically with a conditional write.

    ``storage_options`` go to fsspec unchanged for S3 (s3fs's ``key``, ``secret``,
    ``endpoint_url``, ``client_kwargs``, ...; the usual AWS environment variables
    work); for ``gs://`` they are gcsfs's ``endpoint_url``, ``token`` (``"anon"`` too)
    and ``project``; for ``az://`` adlfs's ``connection_string``, or ``account_name``
    with ``account_key``, ``sas_token`` or ``credential``
    (docs/guides/object-storage.md). ``prefix`` names step folders as
    ``CheckpointDir``'s does. ``checksum``
    is the algorithm recorded per file in the manifest (checked by ``fetch`` and
    ``verify``). ``staging_dir`` is the local directory that commits stage in
    (default: the system's temporary directory); it must hold one checkpoint.
    ``grace`` is how old (seconds) an attempt no manifest references must be
    before ``clean()`` removes it: longer than any upload takes. ``workers`` is the
    number of requests in flight (and of hashing threads). Files of at least
    ``multipart_threshold`` bytes are uploaded in parts of ``part_size`` bytes (at
    least 5 MiB on S3), in parallel, each part with its own CRC-32.

    Before the first commit the store is probed once: a store that does not
    honour create-only and If-Match writes is refused (UnsupportedStoreError).
    """

    def __init__(
        self,
        url: str,
        *,
        storage_options: Mapping[str, Any] | None = None,
        prefix: str = "",
        checksum: str | None = "xxh3_128",
        staging_dir: PathLike | None = None,
        grace: float = DEFAULT_GRACE,
        workers: int = 16,
        part_size: int = PART_SIZE,
        multipart_threshold: int = MULTIPART_THRESHOLD,
    ) -> None:
        check_prefix(prefix)
        self._local = CheckpointDir(
            tempfile.gettempdir(), checksum=checksum, durable=False, workers=workers
        )  # validates checksum and workers; hashes staging trees
        if part_size < 5 << 20 or multipart_threshold < part_size:
            raise ValueError("part_size must be >= 5 MiB and multipart_threshold >= part_size")
        self._store: Store = open_store(url, dict(storage_options or {}))
        self._store.part_size = part_size
        self._store.multipart_threshold = multipart_threshold
        self._store.concurrency = workers
        self._prefix = prefix
        self._checksum = checksum
        self._staging_dir = Path(staging_dir) if staging_dir is not None else None
        self._grace = float(grace)
        self._workers = workers

    def __repr__(self) -> str:
        return f"RemoteCheckpointDir({self.url!r}, prefix={self._prefix!r})"

    @property
    def url(self) -> str:
        """The root URL."""
        return self._store.url

    @property
    def prefix(self) -> str:
        """The step folders' name prefix."""
        return self._prefix

    @property
    def staging_dir(self) -> Path:
        """The local directory commits stage in."""
        return self._staging_dir or Path(tempfile.gettempdir())

    @property
    def fs(self) -> Any:
        """The client underneath: s3fs's filesystem for ``s3://`` (``fs.s3`` is its client),
        the ``google.cloud.storage.Client`` for ``gs://``, the ``BlobServiceClient`` for
        ``az://``."""
        return self._store.fs

    def url_of(self, step: SupportsIndex) -> str:
        """Where ``step``'s checkpoint lives (whether or not it exists)."""
        return self._store.url_of(self._name(_check_step(step)))

    def _name(self, step: int) -> str:
        return f"{self._prefix}{step}"

    # ------------------------------------------------------------------ reading

    def checkpoints(self) -> list[RemoteCheckpoint]:
        """Every complete checkpoint, by ascending step (each manifest read, and its
        objects listed: a manifest whose objects are not all there is skipped)."""
        out = []
        for step, name in _protocol.step_names(self._store, self._prefix):
            ckpt = _protocol.read(self._store, name, step)
            if ckpt is not None:
                out.append(ckpt)
        return out

    def steps(self) -> list[int]:
        """The steps of the complete checkpoints, ascending."""
        return [c.step for c in self.checkpoints()]

    def latest(self, *, verify: bool = False) -> RemoteCheckpoint | None:
        """The complete checkpoint with the highest step, or None.

        Looks from the highest step folder down and stops at the first complete
        one. With ``verify=True``, the newest whose files download and match their
        checksums (a newer one that does not is skipped with a warning).
        """
        for step, name in reversed(_protocol.step_names(self._store, self._prefix)):
            ckpt = _protocol.read(self._store, name, step)
            if ckpt is None:
                continue
            if not verify:
                return ckpt
            try:
                return self.verify(step)
            except (VerificationError, CheckpointNotFoundError) as exc:
                log.warning("skipping checkpoint %s: it does not verify: %s", ckpt.url, exc)
        return None

    def get(self, step: SupportsIndex) -> RemoteCheckpoint:
        """The complete checkpoint of ``step``; CheckpointNotFoundError if absent or incomplete."""
        step = _check_step(step)
        ckpt = _protocol.read(self._store, self._name(step), step)
        if ckpt is None:
            raise CheckpointNotFoundError(
                f"no complete checkpoint for step {step} in {self.url}", step=step
            )
        return ckpt

    def entries(self) -> list[RemoteEntry]:
        """Every step folder, complete or not, sorted by step (what ``ls`` shows)."""
        return _entries.entries(self._store, self._prefix)

    def fetch(self, step: SupportsIndex, dest: PathLike, *, durable: bool = True) -> Checkpoint:
        """Download ``step``'s checkpoint into the new local directory ``dest``.

        The files are downloaded into a staging directory beside ``dest``, with
        the manifest as its ``checkpoint_complete`` marker; every file is checked
        against the manifest (type, size, checksum), made durable (unless
        ``durable=False``), and the directory renamed to ``dest``, which must not
        exist. A mismatch raises VerificationError and leaves nothing behind. The
        result verifies like a local checkpoint (``CheckpointDir.verify``).
        """
        ckpt = self.get(step)
        return _fetch.fetch(self._store, ckpt, self._name(ckpt.step), dest, durable=durable)

    def verify(self, step: SupportsIndex) -> RemoteCheckpoint:
        """Download ``step``'s files (to a temporary directory, then removed) and check
        each against the manifest; return the checkpoint if they all match.

        Raises VerificationError listing every mismatch, or
        CheckpointNotFoundError if the step is not complete.
        """
        ckpt = self.get(step)
        _fetch.verify(self._store, ckpt, self._name(ckpt.step), self.staging_dir)
        return ckpt

    # ------------------------------------------------------------------ writing

    def check_conditional_writes(self) -> None:
        """Probe the store once (later calls return at once): UnsupportedStoreError if it
        does not honour create-only and If-Match writes. A commit whose manifest goes
        through another request (a large one: see the guide) probes that one first."""
        _protocol.require_conditional_writes(self._store, uuid.uuid4().hex)

    def begin(
        self,
        step: SupportsIndex,
        *,
        metadata: Mapping[str, Any] | None = None,
        retain: RetentionPolicy | None = None,
        replace_unusable: bool = False,
    ) -> RemoteCommit:
        """Start a commit of ``step``: a handle whose ``path`` is a local staging directory.

        The step's current manifest (if any) is noted now: publishing replaces
        exactly that one, and fails with StepConflictError if another writer
        committed the step meanwhile. ``retain`` is applied after a successful publish.

        ``metadata`` may be a fetched checkpoint's (copying it to another root): the
        attempt it names under :data:`ATTEMPT_KEY` is the source's, and the commit
        names its own there instead. Any other value under that key is refused.

        A step whose manifest holds a checkpoint this release must not lose is refused
        (StepConflictError, before anything is uploaded): one a newer atomic_ckpt wrote,
        or one copied there by hand from another step. ``replace_unusable=True``
        replaces it knowingly (logged).
        """
        step = _check_step(step)
        meta = _protocol.carried_metadata(metadata or {})
        try:  # checked now, not after the upload: a JSON object that fits in a manifest
            Manifest(step=step, metadata=meta).to_bytes()
        except (TypeError, ValueError) as exc:
            raise ValueError(f"metadata must be a JSON object of finite numbers: {exc}") from None
        self.check_conditional_writes()
        name = self._name(step)
        got = self._store.get(_protocol.manifest_key(name))
        old = None
        if got is not None:
            old = _protocol.replaced_attempt(
                self._store.url_of(name), step, got[0], replace=replace_unusable
            )
        return RemoteCommit(
            self, step, meta, None if got is None else got[1], retain, old_attempt=old
        )

    @contextlib.contextmanager
    def commit(
        self,
        step: SupportsIndex,
        *,
        metadata: Mapping[str, Any] | None = None,
        retain: RetentionPolicy | None = None,
        replace_unusable: bool = False,
    ) -> Iterator[Path]:
        """Stage a checkpoint of ``step`` locally and commit it to the store on a normal exit.

        Yields a local staging directory; write anything inside it. On a normal
        exit its files are uploaded under a fresh attempt, the listing checked, and
        the manifest written conditionally: the step then shows the new contents,
        atomically (replacing the contents it had when the block began). On an
        exception nothing is committed and the exception propagates. ``retain``
        is applied once the commit has succeeded. ``replace_unusable``: as :meth:`begin`.
        """
        with self.begin(
            step, metadata=metadata, retain=retain, replace_unusable=replace_unusable
        ) as handle:
            yield handle.path

    def upload(
        self,
        step: SupportsIndex,
        directory: PathLike,
        *,
        metadata: Mapping[str, Any] | None = None,
        replace_unusable: bool = False,
    ) -> RemoteCheckpoint:
        """Commit the files of an existing local ``directory`` as ``step`` (its marker, if it
        has one, is left out; the directory is not changed). ``replace_unusable``: as
        :meth:`begin`."""
        handle = self.begin(step, metadata=metadata, replace_unusable=replace_unusable)
        try:
            return handle._publish_from(Path(directory))
        finally:
            handle.abort()

    # ------------------------------------------------------------------ removing

    def delete(self, step: SupportsIndex) -> str:
        """Delete ``step``'s checkpoint: the manifest first (the step disappears at once),
        then its attempt's objects. Returns its URL."""
        step = _check_step(step)
        return _clean.delete(self._store, self._name(step), step)

    def prune(self, *, keep_last: int) -> list[str]:
        """Delete all but the ``keep_last`` newest complete checkpoints; return their URLs."""
        return self.retain(RetentionPolicy.last(keep_last))

    def retain(
        self,
        policy: RetentionPolicy | None = None,
        *,
        keep_last: int | None = None,
        keep_every: int | None = None,
        keep_best: int | None = None,
        metric: str | None = None,
        mode: Literal["min", "max"] = "min",
    ) -> list[str]:
        """Apply a :class:`~atomic_ckpt.RetentionPolicy`; return the deleted URLs.

        As ``CheckpointDir.retain``, without the ``checkpoint_best`` pointer (an
        object store has no symlinks): the latest checkpoint is always kept.
        Each deletion removes the manifest first, then the data.
        """
        policy = RetentionPolicy.of(
            policy,
            keep_last=keep_last,
            keep_every=keep_every,
            keep_best=keep_best,
            metric=metric,
            mode=mode,
        )
        found = self.checkpoints()
        as_local = [Checkpoint(c.step, Path(self._name(c.step)), c.manifest) for c in found]
        plan = policy.plan(as_local)
        deleted = []
        for victim in plan.delete:
            with contextlib.suppress(CheckpointNotFoundError):  # deleted meanwhile
                deleted.append(self.delete(victim.step))
        return deleted

    def clean(self, *, dry_run: bool = False, grace: float | None = None) -> list[str]:
        """Remove what crashed, killed or losing commits left; return the URLs removed.

        Removes attempts that no manifest references and whose newest object
        (or unfinished multipart upload) is older than ``grace`` seconds (default:
        the root's), unfinished multipart uploads older than that, and probe
        leftovers. A live upload is younger than the grace period, so it is never
        touched; a committed checkpoint's objects are referenced, so never either.
        """
        grace = self._grace if grace is None else float(grace)
        return _clean.clean(self._store, self._prefix, time.time() - grace, dry_run=dry_run)
