"""The only module that talks to an object store: fsspec (and, for ``s3://``, s3fs's client).

A :class:`Store` is one root (``s3://bucket/prefix``, ``memory://...``) seen as
flat keys relative to it, with the few operations the protocol needs: parallel
uploads and downloads, a listing with sizes, ETags and times, deletion, and the
two conditional writes the commit point rests on:

* :meth:`Store.create`: create-only (S3 ``If-None-Match: *``); raises
  :class:`PreconditionFailed` if the key exists.
* :meth:`Store.replace`: compare-and-swap (S3 ``If-Match: <etag>``); raises
  :class:`PreconditionFailed` if the key's current ETag is another (or it is gone).

Which stores honour them is decided here, once: S3 and S3-compatible servers
through s3fs (checked by :meth:`Store.probe` before the first commit),
``memory://`` (one process: a lock makes its check-and-write atomic). Any other
protocol is refused with :class:`UnsupportedStoreError`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import importlib
import logging
import os
import threading
import time
import zlib
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import CheckpointError

log = logging.getLogger(__name__)

# fsspec and s3fs ship no type information: imported as modules of type Any, so that
# mypy --strict needs no override for them.
fsspec: Any = importlib.import_module("fsspec")
fsspec_asyn: Any = importlib.import_module("fsspec.asyn")
_BOTOCORE: Any = None
"""botocore.exceptions, once an s3:// store is opened."""

PART_SIZE = 32 << 20
"""Bytes per part of a multipart upload (S3 allows 5 MiB to 5 GiB, at most 10,000 parts)."""
MULTIPART_THRESHOLD = 64 << 20
"""Files at least this large are uploaded in parts (in parallel, each with its own CRC-32)."""
CONCURRENCY = 16
"""Requests in flight at once (uploads, downloads, deletes)."""
_MAX_PARTS = 10_000


class UnsupportedStoreError(CheckpointError, OSError):
    """The store cannot give the commit point its guarantee (no create-only or
    compare-and-swap write), so nothing is committed there."""


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

    def __init__(self, url: str, fs: Any, root: str) -> None:
        self.url = url.rstrip("/")
        self.fs = fs
        self.root = root.strip("/")

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

    def probe(self, key: str) -> str | None:
        """Why conditional writes cannot be trusted here, or None if they work.

        Writes ``key`` create-only twice (the second must fail), replaces it with a
        wrong ETag (must fail) and with the right one (must succeed), then deletes it.
        """
        try:
            etag = self.create(key, b"probe 1\n")
            try:
                self.create(key, b"probe 2\n")
            except PreconditionFailed:
                pass
            else:
                return "a create-only write (If-None-Match: *) overwrote an existing object"
            try:
                self.replace(key, b"probe 3\n", '"0123456789abcdef0123456789abcdef"')
            except PreconditionFailed:
                pass
            else:
                return "a write conditional on a wrong ETag (If-Match) was accepted"
            self.replace(key, b"probe 4\n", etag)
            return None
        except PreconditionFailed:
            return "a write conditional on the object's own ETag (If-Match) was refused"
        finally:
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


# ---------------------------------------------------------------- S3 (s3fs)


def _client_error(exc: BaseException) -> tuple[int | None, str | None]:
    """(HTTP status, S3 error code) of a botocore ClientError in ``exc`` or its causes."""
    seen: BaseException | None = exc
    while seen is not None:
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            return status, response.get("Error", {}).get("Code")
        seen = seen.__cause__ or seen.__context__
    return None, None


def _is_412(exc: BaseException) -> bool:
    status, code = _client_error(exc)
    return status == 412 or code == "PreconditionFailed"


def _is_409(exc: BaseException) -> bool:
    status, code = _client_error(exc)
    return status == 409 or code == "ConditionalRequestConflict"


_CONFLICT_RETRIES = 5


class S3Store(Store):
    """S3 and S3-compatible servers, through s3fs's (aiobotocore) client.

    Every request goes through s3fs's ``_call_s3`` (its retries and error
    translation) on s3fs's event loop; the protocol's conditional writes are
    PutObject with ``IfNoneMatch="*"`` or ``IfMatch=<etag>``. Objects carry
    CRC-32 checksums the server checks on receipt (each part of a multipart
    upload its own).
    """

    part_size = PART_SIZE
    multipart_threshold = MULTIPART_THRESHOLD
    concurrency = CONCURRENCY

    def __init__(self, url: str, fs: Any, root: str) -> None:
        super().__init__(url, fs, root)
        bucket, _, key = self.root.partition("/")
        if not bucket:
            raise ValueError(f"{url}: name a bucket (s3://bucket/prefix)")
        self.bucket = bucket
        self.base = key.strip("/")

    def _key(self, key: str) -> str:
        return f"{self.base}/{key}" if self.base else key

    def _rel(self, full: str) -> str:
        return full[len(self.base) + 1 :] if self.base else full

    def _run(self, coro: Any) -> Any:
        return fsspec_asyn.sync(self.fs.loop, lambda: coro)

    async def _call(self, method: str, **kwargs: Any) -> Any:
        try:
            return await self.fs._call_s3(method, Bucket=self.bucket, **kwargs)
        except _BOTOCORE.BotoCoreError as exc:  # transport errors: not OSErrors in botocore
            key = kwargs.get("Key") or kwargs.get("Prefix") or ""
            raise OSError(f"{self.url}: {method} {key} failed: {exc}") from exc

    # ------------------------------------------------------------ the commit point

    def _conditional_put(self, key: str, data: bytes, condition: dict[str, str]) -> str:
        for _ in range(_CONFLICT_RETRIES):
            try:
                out = self._run(
                    self._call(
                        "put_object",
                        Key=self._key(key),
                        Body=data,
                        ChecksumAlgorithm="CRC32",
                        **condition,
                    )
                )
            except Exception as exc:
                if _is_412(exc):
                    raise PreconditionFailed(self.url_of(key)) from exc
                if _is_409(exc):  # a concurrent conditional write on the key: try again
                    time.sleep(0.05)
                    continue
                raise
            return str(out["ETag"])
        raise OSError(f"{self.url_of(key)}: conditional write kept conflicting (HTTP 409)")

    def create(self, key: str, data: bytes) -> str:
        return self._conditional_put(key, data, {"IfNoneMatch": "*"})

    def replace(self, key: str, data: bytes, etag: str) -> str:
        return self._conditional_put(key, data, {"IfMatch": etag})

    # ------------------------------------------------------------ objects

    def upload(self, files: Sequence[Upload]) -> dict[str, str]:
        return dict(self._run(self._upload_all(files)))

    async def _upload_all(self, files: Sequence[Upload]) -> list[tuple[str, str]]:
        limit = asyncio.Semaphore(self.concurrency)
        tasks = [asyncio.ensure_future(self._upload_one(f, limit)) for f in files]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:  # one failed: stop the rest before raising
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _upload_one(self, f: Upload, limit: asyncio.Semaphore) -> tuple[str, str]:
        key = self._key(f.key)
        if f.size < self.multipart_threshold:
            async with limit:
                data = _read(f.path, 0, f.size)
                out = await self._call("put_object", Key=key, Body=data, ChecksumAlgorithm="CRC32")
            return f.key, str(out["ETag"])
        part = max(self.part_size, -(-f.size // _MAX_PARTS))
        mpu = await self._call("create_multipart_upload", Key=key, ChecksumAlgorithm="CRC32")
        upload_id = mpu["UploadId"]
        try:

            async def one(number: int, offset: int) -> dict[str, Any]:
                async with limit:
                    data = _read(f.path, offset, min(part, f.size - offset))
                    crc = base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()
                    out = await self._call(
                        "upload_part",
                        Key=key,
                        UploadId=upload_id,
                        PartNumber=number,
                        Body=data,
                        ChecksumCRC32=crc,
                    )
                return {"PartNumber": number, "ETag": out["ETag"], "ChecksumCRC32": crc}

            parts = await asyncio.gather(
                *(one(i + 1, off) for i, off in enumerate(range(0, f.size, part)))
            )
            out = await self._call(
                "complete_multipart_upload",
                Key=key,
                UploadId=upload_id,
                MultipartUpload={"Parts": list(parts)},
            )
        except BaseException:
            with contextlib.suppress(Exception):
                await self._call("abort_multipart_upload", Key=key, UploadId=upload_id)
            raise
        return f.key, str(out["ETag"])

    def get(self, key: str) -> tuple[bytes, str] | None:
        async def go() -> tuple[bytes, str] | None:
            try:
                out = await self._call("get_object", Key=self._key(key))
            except FileNotFoundError:
                return None
            try:
                body = await out["Body"].read()
            finally:
                out["Body"].close()
            return bytes(body), str(out["ETag"])

        result: tuple[bytes, str] | None = self._run(go())
        return result

    async def _list(self, prefix: str, delimiter: str = "") -> tuple[list[Any], list[str]]:
        objects: list[Any] = []
        folders: list[str] = []
        kwargs: dict[str, Any] = {"Prefix": self._key(prefix) if prefix else self._prefix()}
        if delimiter:
            kwargs["Delimiter"] = delimiter
        while True:
            out = await self._call("list_objects_v2", **kwargs)
            objects += out.get("Contents", [])
            folders += [p["Prefix"] for p in out.get("CommonPrefixes", [])]
            if not out.get("IsTruncated"):
                return objects, folders
            kwargs["ContinuationToken"] = out["NextContinuationToken"]

    def _prefix(self) -> str:
        return f"{self.base}/" if self.base else ""

    def find(self, prefix: str) -> dict[str, ObjectInfo]:
        objects, _ = self._run(self._list(prefix))
        return {
            (key := self._rel(o["Key"])): ObjectInfo(
                key, int(o["Size"]), str(o["ETag"]), o["LastModified"].timestamp()
            )
            for o in objects
        }

    def children(self, prefix: str) -> list[str]:
        objects, folders = self._run(self._list(prefix, "/"))
        start = len(self._key(prefix) if prefix else self._prefix())
        names = [f[start:].rstrip("/") for f in folders]
        names += [o["Key"][start:] for o in objects]
        return sorted(n for n in names if n)

    def download(self, pairs: Sequence[tuple[str, Path]]) -> None:
        async def one(key: str, dest: Path, limit: asyncio.Semaphore) -> None:
            async with limit:
                out = await self._call("get_object", Key=self._key(key))
                try:
                    with open(dest, "xb") as f:
                        while chunk := await out["Body"].read(8 << 20):
                            f.write(chunk)
                finally:
                    out["Body"].close()

        async def go() -> None:
            limit = asyncio.Semaphore(self.concurrency)
            await asyncio.gather(*(one(k, d, limit) for k, d in pairs))

        self._run(go())

    def delete(self, keys: Iterable[str]) -> None:
        full = [self._key(k) for k in keys]

        async def go() -> None:
            for i in range(0, len(full), 1000):
                batch = full[i : i + 1000]
                out = await self._call(
                    "delete_objects",
                    Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
                )
                errors = out.get("Errors") or []
                if errors:
                    first = errors[0]
                    raise OSError(
                        f"{self.url}: could not delete {len(errors)} objects, e.g. "
                        f"{first.get('Key')}: {first.get('Code')} {first.get('Message')}"
                    )

        if full:
            self._run(go())

    async def _uploads(self, prefix: str) -> list[Any]:
        uploads: list[Any] = []
        kwargs: dict[str, Any] = {"Prefix": self._key(prefix) if prefix else self._prefix()}
        while True:
            out = await self._call("list_multipart_uploads", **kwargs)
            uploads += out.get("Uploads", [])
            if not out.get("IsTruncated"):
                return uploads
            kwargs["KeyMarker"] = out["NextKeyMarker"]
            kwargs["UploadIdMarker"] = out["NextUploadIdMarker"]

    def live_uploads(self, prefix: str) -> dict[str, float]:
        return {
            self._rel(u["Key"]): u["Initiated"].timestamp()
            for u in self._run(self._uploads(prefix))
        }

    def stale_uploads(self, prefix: str, older_than: float) -> list[tuple[str, str]]:
        return [
            (self._rel(u["Key"]), str(u["UploadId"]))
            for u in self._run(self._uploads(prefix))
            if u["Initiated"].timestamp() < older_than
        ]

    def abort_uploads(self, uploads: Sequence[tuple[str, str]]) -> None:
        async def go() -> None:
            for key, upload_id in uploads:
                with contextlib.suppress(FileNotFoundError):
                    await self._call(
                        "abort_multipart_upload", Key=self._key(key), UploadId=upload_id
                    )

        self._run(go())


def _read(path: Path, offset: int, size: int) -> bytes:
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


# ---------------------------------------------------------------- memory:// (one process)


_MEMORY_LOCK = threading.Lock()


class MemoryStore(Store):
    """fsspec's in-memory filesystem: one process's store, for tests and examples.

    Its conditional writes are a check and a write under one lock, which is
    atomic because every writer is in this process. ETags are MD5 digests of
    the contents, as S3's are for a plain PutObject.
    """

    def _etag(self, data: bytes) -> str:
        return f'"{hashlib.md5(data, usedforsecurity=False).hexdigest()}"'

    def create(self, key: str, data: bytes) -> str:
        with _MEMORY_LOCK:
            if self.fs.exists(self.path(key)):
                raise PreconditionFailed(self.url_of(key))
            self.fs.pipe_file(self.path(key), data)
        return self._etag(data)

    def replace(self, key: str, data: bytes, etag: str) -> str:
        with _MEMORY_LOCK:
            try:
                current = self.fs.cat_file(self.path(key))
            except FileNotFoundError:
                raise PreconditionFailed(self.url_of(key)) from None
            if self._etag(current) != etag:
                raise PreconditionFailed(self.url_of(key))
            self.fs.pipe_file(self.path(key), data)
        return self._etag(data)

    def upload(self, files: Sequence[Upload]) -> dict[str, str]:
        out = {}
        for f in files:
            data = _read(f.path, 0, f.size)
            self.fs.pipe_file(self.path(f.key), data)
            out[f.key] = self._etag(data)
        return out

    def get(self, key: str) -> tuple[bytes, str] | None:
        with _MEMORY_LOCK:
            try:
                data = bytes(self.fs.cat_file(self.path(key)))
            except FileNotFoundError:
                return None
        return data, self._etag(data)

    def find(self, prefix: str) -> dict[str, ObjectInfo]:
        start = len(self.root) + 1
        out = {}
        with _MEMORY_LOCK:
            found = self.fs.find(self.path(prefix), detail=True)
            for path, info in found.items():
                key = path.lstrip("/")[start:]
                if not key.startswith(prefix):
                    continue
                data = self.fs.cat_file(path)
                created = info.get("created") or time.time()
                out[key] = ObjectInfo(key, int(info["size"]), self._etag(data), float(created))
        return out

    def children(self, prefix: str) -> list[str]:
        try:
            listed = self.fs.ls(self.path(prefix), detail=False)
        except FileNotFoundError:
            return []
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in listed)

    def download(self, pairs: Sequence[tuple[str, Path]]) -> None:
        for key, dest in pairs:
            data = self.fs.cat_file(self.path(key))
            with open(dest, "xb") as f:
                f.write(data)

    def delete(self, keys: Iterable[str]) -> None:
        with _MEMORY_LOCK:
            for key in keys:
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm_file(self.path(key))


# ---------------------------------------------------------------- opening a URL


def open_store(url: str, storage_options: dict[str, Any] | None) -> Store:
    """The store of ``url``; ``storage_options`` go to fsspec unchanged."""
    if not isinstance(url, str) or "://" not in url:
        raise ValueError(f"{url!r} is not a URL (s3://bucket/prefix, memory://name)")
    protocol = url.split("://", 1)[0].lower()
    options = dict(storage_options or {})
    if protocol in ("s3", "s3a"):
        try:
            importlib.import_module("s3fs")  # fsspec finds it; imported here for the hint
        except ImportError:
            raise ImportError("s3:// needs s3fs: pip install 'atomic_ckpt[s3]'") from None
        global _BOTOCORE  # noqa: PLW0603 (imported with s3fs, which needs it)
        _BOTOCORE = importlib.import_module("botocore.exceptions")
        fs, root = fsspec.core.url_to_fs(url, **options)
        return S3Store(url, fs, root)
    if protocol == "memory":
        fs, root = fsspec.core.url_to_fs(url, **options)
        return MemoryStore(url, fs, "/" + root.strip("/"))
    raise UnsupportedStoreError(
        f"{url}: atomic_ckpt.remote commits only where the store has a create-only "
        "and a compare-and-swap write: s3:// (AWS S3 and S3-compatible servers that "
        "honour If-None-Match and If-Match) and memory://. For a local or mounted "
        "filesystem use atomic_ckpt.CheckpointDir",
        path=None,
    )
