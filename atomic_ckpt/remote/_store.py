"""The object-store interface the commit protocol is written against: :class:`Store`.

A :class:`Store` is one root (``s3://bucket/prefix``, ``memory://...``) seen as
flat keys relative to it, with the few operations the protocol needs: parallel
uploads and downloads, a listing with sizes, ETags and times, deletion, and the
two conditional writes the commit point rests on:

* :meth:`Store.create`: create-only (S3 ``If-None-Match: *``); raises
  :class:`PreconditionFailed` if the key exists.
* :meth:`Store.replace`: compare-and-swap (S3 ``If-Match: <etag>``); raises
  :class:`PreconditionFailed` if the key's current ETag is another (or it is gone).

Only the stores talk to an object store: :class:`~._s3.S3Store` (S3 and
S3-compatible servers through s3fs), :class:`~._gcs.GCSStore` (Google Cloud
Storage: generations), :class:`~._azure.AzureStore` (Azure Blob: ETags), each
checked by :meth:`Store.probe` before the first commit, and
:class:`~._memory.MemoryStore` (``memory://``, one process).
Which stores are trusted is decided once, by :func:`._open.open_store`; any other
protocol is refused with :class:`UnsupportedStoreError`.
"""

from __future__ import annotations

import contextlib
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from atomic_ckpt._core.l1_names.errors import CheckpointError

log = logging.getLogger(__name__)

T = TypeVar("T")


class UnsupportedStoreError(CheckpointError, OSError):
    """The store cannot give the commit point its guarantee (no create-only or
    compare-and-swap write), so nothing is committed there."""


class NoSuchBucketError(CheckpointError, OSError):
    """The root's bucket does not exist (on this endpoint). An error, not a missing
    checkpoint: it is no FileNotFoundError, so nothing reads it as "no such step"."""


class EndpointUnreachable(OSError):
    """No connection to the endpoint could be made (:mod:`._http`'s retries spent). No
    ConnectionError, so that no client retries it again: a store's error handling turns
    it into one, naming the root."""


class DeadlineExceeded(OSError):
    """An operation's requests kept failing for ``retry_deadline`` (:mod:`._http`). No
    TimeoutError, so that no client retries it: a store turns it into one, naming the
    root."""


class PreconditionFailed(Exception):
    """A conditional write found the key not in the state it required (HTTP 412)."""


@dataclass(frozen=True)
class ObjectInfo:
    """One object as a listing shows it: key (relative to the root), size, ETag, mtime."""

    key: str
    size: int
    etag: str
    mtime: float


@dataclass(frozen=True)
class Upload:
    """A local file and the key it goes to."""

    path: Path
    key: str
    size: int


class Store(ABC):
    """One root of an object store, addressed by keys relative to it."""

    part_size = 32 << 20
    """Bytes per part (block, chunk) of a large file's upload."""
    multipart_threshold = 64 << 20
    """Files at least this large are uploaded in parts."""
    concurrency = 16
    """Requests in flight at once (uploads, downloads, deletes)."""

    def __init__(self, url: str, fs: Any, root: str) -> None:
        self.url = url.rstrip("/")
        self.fs = fs
        self.root = root.strip("/")
        self.probed: set[str] = set()
        """The :meth:`conditional_path` values the probe has found enforced."""

    def path(self, key: str) -> str:
        """The fsspec path of ``key``."""
        return f"{self.root}/{key}" if key else self.root

    def url_of(self, key: str) -> str:
        """The URL of ``key`` (for messages and listings)."""
        return f"{self.url}/{key}" if key else self.url

    # ------------------------------------------------------------ the commit point

    @abstractmethod
    def create(self, key: str, data: bytes) -> str:
        """Write ``data`` to ``key`` only if it does not exist; return its ETag."""

    @abstractmethod
    def replace(self, key: str, data: bytes, etag: str) -> str:
        """Write ``data`` to ``key`` only if its ETag is ``etag``; return the new ETag."""

    create_condition = "If-None-Match: *"
    """How this store's create-only write is sent (for messages)."""
    replace_condition = "If-Match: <etag>"
    """How this store's compare-and-swap write is sent (for messages)."""
    wrong_etag = '"0123456789abcdef0123456789abcdef"'
    """An ETag no object has: the probe's replace conditional on it must fail."""

    def conditional_path(self, size: int) -> str:
        """The request a conditional write of ``size`` bytes goes through ("" when every
        size goes the same way). A client may send a large write another way than a small
        one (GCS: a resumable upload past the multipart limit; Azure: staged blocks past
        ``max_single_put_size``): the probe must have checked each way before it is used."""
        return ""

    def probe(self, key: str, size: int = 0) -> str | None:
        """Why conditional writes cannot be trusted here, or None if they work.

        Writes ``key`` create-only twice (the second must fail), replaces it with a
        wrong ETag (must fail) and with the right one (must succeed), then deletes it;
        each write ``size`` bytes long (so it goes the way a write that size goes).
        """

        def payload(n: int) -> bytes:
            return f"probe {n}\n".encode().ljust(size, b".")

        gone = False
        try:
            etag = self.create(key, payload(1))
            try:
                self.create(key, payload(2))
            except PreconditionFailed:
                pass
            else:
                return f"a create-only write ({self.create_condition}) overwrote an existing object"
            try:
                self.replace(key, payload(3), self.wrong_etag)
            except PreconditionFailed:
                pass
            else:
                return (
                    f"a write conditional on a wrong ETag ({self.replace_condition}) was accepted"
                )
            self.replace(key, payload(4), etag)
            return None
        except PreconditionFailed:
            return (
                f"a write conditional on the object's own ETag ({self.replace_condition}) "
                "was refused"
            )
        except (TimeoutError, ConnectionError):
            # The store stopped answering: deleting would wait out another retry_deadline
            # (clean() removes a probe's leftovers).
            gone = True
            raise
        finally:
            if not gone:
                with contextlib.suppress(OSError):
                    self.delete([key])

    # ------------------------------------------------------------ objects

    @abstractmethod
    def upload(self, files: Sequence[Upload]) -> dict[str, str]:
        """Upload ``files`` in parallel (plain writes: the keys are new); key -> ETag."""

    @abstractmethod
    def get(self, key: str) -> tuple[bytes, str] | None:
        """The bytes and ETag of ``key``, or None if it does not exist."""

    @abstractmethod
    def find(self, prefix: str) -> dict[str, ObjectInfo]:
        """Every object whose key starts with ``prefix`` (a ``.../`` folder), by key."""

    @abstractmethod
    def children(self, prefix: str) -> list[str]:
        """The names one level below ``prefix`` (``""``: the root), objects and folders."""

    @abstractmethod
    def download(self, pairs: Sequence[tuple[str, Path]]) -> None:
        """Download each key to its local path (parents exist), in parallel."""

    @abstractmethod
    def delete(self, keys: Iterable[str]) -> None:
        """Delete the keys (missing ones are no error)."""

    def stale_uploads(self, prefix: str, older_than: float) -> list[tuple[str, str]]:
        """Multipart uploads under ``prefix`` begun before ``older_than``: (key, upload id)."""
        return []

    def live_uploads(self, prefix: str) -> dict[str, float]:
        """Keys under ``prefix`` with an unfinished multipart upload: key -> start time."""
        return {}

    def abort_uploads(self, uploads: Sequence[tuple[str, str]]) -> None:  # noqa: B027
        """Abort these multipart uploads (stores without them have none to abort)."""


def read_range(path: Path, offset: int, size: int) -> bytes:
    """``size`` bytes of ``path`` at ``offset`` (a file that shrank since it was listed fails)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        chunks = []
        while size > 0:
            chunk = os.pread(fd, min(size, 1 << 30), offset)
            if not chunk:
                raise OSError(f"{path} shrank while it was uploaded")
            chunks.append(chunk)
            size -= len(chunk)
            offset += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def run_parallel(fn: Callable[..., T], items: Iterable[Sequence[Any]], workers: int) -> list[T]:
    """``[fn(*item) for item in items]``, ``workers`` at a time in threads (for the stores
    whose clients block); the first failure is raised once the calls begun have ended,
    and the calls not begun are cancelled."""
    todo = [tuple(item) for item in items]
    if len(todo) <= 1 or workers <= 1:
        return [fn(*item) for item in todo]
    with ThreadPoolExecutor(min(workers, len(todo))) as pool:
        futures = [pool.submit(fn, *item) for item in todo]
        try:
            return [f.result() for f in futures]
        finally:
            for f in futures:
                f.cancel()
