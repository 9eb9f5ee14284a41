"""``RemoteCheckpointDir``: the facade over one object-store root, mirroring ``CheckpointDir``."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, SupportsIndex

from .. import (
    MARKER,
    Checkpoint,
    CheckpointDir,
    CheckpointNotFoundError,
    CommitStateError,
    FileEntry,
    InvalidStepError,
    Manifest,
    ManifestError,
    RetentionPolicy,
    VerificationError,
    _fs,
    parse_step,
)
from . import _protocol
from ._protocol import ATTEMPT_KEY, ATTEMPT_RE, PROBE_DIR, RemoteCheckpoint
from ._store import MULTIPART_THRESHOLD, PART_SIZE, S3Store, Store, open_store

log = logging.getLogger(__name__)

PathLike = str | os.PathLike[str]

DEFAULT_GRACE = 3600.0
"""Seconds an unreferenced attempt must be left alone before ``clean()`` removes it."""

Status = Literal["complete", "incomplete", "uncommitted"]


@dataclass(frozen=True)
class RemoteEntry:
    """One step folder of a remote root as ``atomic-ckpt ls`` shows it.

    ``status``: ``complete`` (a manifest whose objects are all there),
    ``incomplete`` (a manifest that is invalid or lists missing objects: see
    ``problem``) or ``uncommitted`` (attempts but no manifest: an upload in
    progress, or what a crashed or losing one left; ``clean()`` removes those).
    """

    name: str
    url: str
    step: int
    status: Status
    manifest: Manifest | None = None
    problem: str | None = None
    attempts: int = 0


def _check_step(raw: SupportsIndex) -> int:
    try:
        step = raw.__index__()
    except (AttributeError, TypeError):
        step = None
    if step is None or isinstance(raw, bool) or step < 0:
        raise InvalidStepError(f"step must be a non-negative int, got {raw!r}", step=None)
    return step


class RemoteCheckpointDir:
    """Checkpoints in an object store (``s3://bucket/prefix``, ``memory://name``), one
    folder per step, committed atomically with a conditional write.

    ``storage_options`` go to fsspec unchanged (for S3, s3fs's ``key``, ``secret``,
    ``endpoint_url``, ``client_kwargs``, ...; the usual AWS environment variables
    work). ``prefix`` names step folders as ``CheckpointDir``'s does. ``checksum``
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
        if not isinstance(prefix, str) or "/" in prefix or ".tmp-" in prefix:
            raise ValueError(f"prefix {prefix!r} must be a plain name fragment")
        self._local = CheckpointDir(
            tempfile.gettempdir(), checksum=checksum, durable=False, workers=workers
        )  # validates checksum and workers; hashes staging trees
        if part_size < 5 << 20 or multipart_threshold < part_size:
            raise ValueError("part_size must be >= 5 MiB and multipart_threshold >= part_size")
        self._store: Store = open_store(url, dict(storage_options or {}))
        if isinstance(self._store, S3Store):
            self._store.part_size = part_size
            self._store.multipart_threshold = multipart_threshold
            self._store.concurrency = workers
        self._prefix = prefix
        self._checksum = checksum
        self._staging_dir = Path(staging_dir) if staging_dir is not None else None
        self._grace = float(grace)
        self._workers = workers
        self._probed = False

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
        """The fsspec filesystem underneath (e.g. ``fs.s3``, s3fs's client)."""
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
        out = []
        for step, name in _protocol.step_names(self._store, self._prefix):
            attempts = sum(1 for n in self._store.children(name + "/") if ATTEMPT_RE.fullmatch(n))
            url = self._store.url_of(name)
            got = self._store.get(_protocol.manifest_key(name))
            if got is None:
                out.append(RemoteEntry(name, url, step, "uncommitted", attempts=attempts))
                continue
            try:
                manifest, attempt = _protocol.parse(url, step, got[0])
                problems = _protocol.missing(
                    manifest,
                    self._store.find(_protocol.data_prefix(name, attempt)),
                    _protocol.data_prefix(name, attempt),
                )
            except ManifestError as exc:
                out.append(RemoteEntry(name, url, step, "incomplete", problem=str(exc)))
                continue
            if problems:
                out.append(
                    RemoteEntry(
                        name, url, step, "incomplete", manifest, problems[0], attempts=attempts
                    )
                )
            else:
                out.append(RemoteEntry(name, url, step, "complete", manifest, attempts=attempts))
        return out

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
        dest = Path(os.path.abspath(dest))
        if os.path.lexists(dest):
            raise FileExistsError(f"{dest} exists: fetch into a new directory")
        staging = dest.parent / f"{dest.name}.tmp-{uuid.uuid4().hex}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        staging.mkdir()
        try:
            self._download(ckpt, staging, durable=durable)
            _fs.rename_noreplace(staging, dest)
            if durable:
                _fs.fsync_dir(dest.parent)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return Checkpoint(ckpt.step, dest, ckpt.manifest)

    def _download(self, ckpt: RemoteCheckpoint, into: Path, *, durable: bool) -> None:
        m = ckpt.manifest
        prefix = _protocol.data_prefix(self._name(ckpt.step), ckpt.attempt)
        files = [e for e in m.files if e.type == "file"]
        for e in m.files:
            if e.type == "dir":
                (into / e.path).mkdir(parents=True, exist_ok=True)
        for e in files:
            (into / e.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            self._store.download([(prefix + e.path, into / e.path) for e in files])
        except FileNotFoundError as exc:
            raise CheckpointNotFoundError(
                f"{ckpt.url}: an object of the checkpoint vanished while it was downloaded "
                f"(the step was replaced or deleted meanwhile: fetch again): {exc}",
                step=ckpt.step,
            ) from None
        for e in m.files:  # last: nothing is ever written through a link
            if e.type == "symlink" and e.target is not None:
                _fs.symlink(e.target, into / e.path)
        (into / MARKER).write_bytes(m.to_bytes())
        checker = CheckpointDir(into.parent, checksum=m.checksum, durable=durable)
        found = checker.sync_tree(into, hash=m.checksum is not None)
        problems = _compare(list(m.files), found)
        if problems:
            raise VerificationError(
                f"{ckpt.url}: the downloaded files do not match the manifest: {problems[0]}"
                + (f" (and {len(problems) - 1} more: see .problems)" if problems[1:] else ""),
                step=ckpt.step,
                problems=tuple(problems),
            )

    def verify(self, step: SupportsIndex) -> RemoteCheckpoint:
        """Download ``step``'s files (to a temporary directory, then removed) and check
        each against the manifest; return the checkpoint if they all match.

        Raises VerificationError listing every mismatch, or
        CheckpointNotFoundError if the step is not complete.
        """
        ckpt = self.get(step)
        self.staging_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="atomic_ckpt-verify-", dir=self.staging_dir) as tmp:
            into = Path(tmp) / str(ckpt.step)
            into.mkdir()
            self._download(ckpt, into, durable=False)
        return ckpt

    # ------------------------------------------------------------------ writing

    def check_conditional_writes(self) -> None:
        """Probe the store once (later calls return at once): UnsupportedStoreError if it
        does not honour create-only and If-Match writes."""
        if not self._probed:
            _protocol.require_conditional_writes(self._store, uuid.uuid4().hex)
            self._probed = True

    def begin(
        self,
        step: SupportsIndex,
        *,
        metadata: Mapping[str, Any] | None = None,
        retain: RetentionPolicy | None = None,
    ) -> RemoteCommit:
        """Start a commit of ``step``: a handle whose ``path`` is a local staging directory.

        The step's current manifest (if any) is noted now: publishing replaces
        exactly that one, and fails with StepConflictError if another writer
        committed the step meanwhile. ``retain`` is applied after a successful publish.
        """
        step = _check_step(step)
        meta = dict(metadata or {})
        if ATTEMPT_KEY in meta:
            raise ValueError(f"metadata key {ATTEMPT_KEY!r} is reserved")
        try:  # checked now, not after the upload: a JSON object that fits in a manifest
            Manifest(step=step, metadata=meta).to_bytes()
        except (TypeError, ValueError) as exc:
            raise ValueError(f"metadata must be a JSON object of finite numbers: {exc}") from None
        self.check_conditional_writes()
        name = self._name(step)
        got = self._store.get(_protocol.manifest_key(name))
        old = None
        if got is not None:
            with contextlib.suppress(ManifestError):
                old = _protocol.parse(self._store.url_of(name), step, got[0])[1]
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
    ) -> Iterator[Path]:
        """Stage a checkpoint of ``step`` locally and commit it to the store on a normal exit.

        Yields a local staging directory; write anything inside it. On a normal
        exit its files are uploaded under a fresh attempt, the listing checked, and
        the manifest written conditionally: the step then shows the new contents,
        atomically (replacing the contents it had when the block began). On an
        exception nothing is committed and the exception propagates. ``retain``
        is applied once the commit has succeeded.
        """
        with self.begin(step, metadata=metadata, retain=retain) as handle:
            yield handle.path

    def upload(
        self, step: SupportsIndex, directory: PathLike, *, metadata: Mapping[str, Any] | None = None
    ) -> RemoteCheckpoint:
        """Commit the files of an existing local ``directory`` as ``step`` (its marker, if it
        has one, is left out; the directory is not changed)."""
        handle = self.begin(step, metadata=metadata)
        try:
            return handle._publish_from(Path(directory))
        finally:
            handle.abort()

    def delete(self, step: SupportsIndex) -> str:
        """Delete ``step``'s checkpoint: the manifest first (the step disappears at once),
        then its attempt's objects. Returns its URL."""
        step = _check_step(step)
        name = self._name(step)
        got = self._store.get(_protocol.manifest_key(name))
        if got is None:
            raise CheckpointNotFoundError(f"no checkpoint for step {step} in {self.url}", step=step)
        try:
            _, attempt = _protocol.parse(self._store.url_of(name), step, got[0])
        except ManifestError:
            attempt = None
        self._store.delete([_protocol.manifest_key(name)])
        if attempt is not None:
            _protocol.discard(self._store, _protocol.data_prefix(name, attempt))
        return self._store.url_of(name)

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
        store = self._store
        cutoff = time.time() - grace
        # Listed before the manifests are read: an attempt committed in between is
        # then seen as referenced.
        objects = store.find("")
        live = store.live_uploads("")
        referenced: set[str] = set()
        for step, name in _protocol.step_names(store, self._prefix):
            got = store.get(_protocol.manifest_key(name))
            if got is None:
                continue
            try:
                referenced.add(_protocol.data_prefix(name, _protocol.parse(name, step, got[0])[1]))
            except ManifestError:
                continue
        groups: dict[str, list[str]] = {}
        newest: dict[str, float] = {}
        for key, info in list(objects.items()) + [(k, _Live(t)) for k, t in live.items()]:
            group = self._group(key)
            if group is None or group in referenced:
                continue
            if not isinstance(info, _Live):
                groups.setdefault(group, []).append(key)
            newest[group] = max(newest.get(group, 0.0), info.mtime)
        removed = []
        for group in sorted(newest):
            if newest[group] >= cutoff:
                continue
            removed.append(store.url_of(group))
            if not dry_run:
                store.delete(groups.get(group, []))
        stale = [
            (k, u) for k, u in store.stale_uploads("", cutoff) if self._group(k) not in referenced
        ]
        if stale and not dry_run:
            store.abort_uploads(stale)
        return removed

    def _group(self, key: str) -> str | None:
        """The attempt folder (``7/<attempt>/``) or probe object ``key`` belongs to."""
        head, _, rest = key.partition("/")
        if head == PROBE_DIR:
            return key
        step = parse_step(head, self._prefix)
        attempt = rest.partition("/")[0]
        if step is None or ATTEMPT_RE.fullmatch(attempt) is None or "/" not in rest:
            return None
        return f"{head}/{attempt}/"


@dataclass(frozen=True)
class _Live:
    mtime: float


class RemoteCommit:
    """One commit in progress: ``path`` is its local staging directory.

    ``publish()`` uploads and commits; ``abort()`` gives up. As a context manager,
    a normal exit publishes and an exception aborts.
    """

    def __init__(
        self,
        rdir: RemoteCheckpointDir,
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
        if self._done:
            raise CommitStateError("this commit was already published or aborted")
        self._done = True
        rdir = self._rdir
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
        """Give up (nothing was uploaded yet) or clean up after publishing."""
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


def _compare(expected: list[FileEntry], found: list[FileEntry]) -> list[str]:
    want = {e.path: e for e in expected}
    have = {e.path: e for e in found}
    problems = []
    for path, e in sorted(want.items()):
        got = have.get(path)
        if got is None:
            problems.append(f"{path}: missing")
        elif got.type != e.type:
            problems.append(f"{path}: is a {got.type}, manifest says {e.type}")
        elif got.size != e.size:
            problems.append(f"{path}: size is {got.size}, manifest says {e.size}")
        elif e.checksum is not None and got.checksum != e.checksum:
            problems.append(f"{path}: checksum is {got.checksum}, manifest says {e.checksum}")
        elif got.target != e.target:
            problems.append(f"{path}: symlink points to {got.target!r}, not {e.target!r}")
    problems += [f"{p}: not in the manifest" for p in sorted(set(have) - set(want))]
    return problems
