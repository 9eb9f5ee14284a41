"""S3 and S3-compatible servers as a :class:`~._store.Store`: :class:`S3Store`, on s3fs's
(aiobotocore) client.

The commit point's conditional writes are PutObject with ``IfNoneMatch="*"`` or
``IfMatch=<etag>``: an HTTP 412 becomes :class:`~._store.PreconditionFailed`, a
409 (a concurrent conditional write on the key) is retried. Uploads run in
parallel; large files go in parts, each with its own CRC-32. botocore's transport
errors become OSErrors.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import importlib
import time
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from atomic_ckpt.remote._store import (
    NoSuchBucketError,
    ObjectInfo,
    PreconditionFailed,
    Store,
    Upload,
    read_range,
)

# fsspec and s3fs ship no type information: imported as modules of type Any, so that
# mypy --strict needs no override for them.
fsspec_asyn: Any = importlib.import_module("fsspec.asyn")
_BOTOCORE: Any = None
"""botocore.exceptions, once an s3:// store is opened (:func:`load_s3fs`)."""

PART_SIZE = 32 << 20
"""Bytes per part of a multipart upload (S3 allows 5 MiB to 5 GiB, at most 10,000 parts)."""
MULTIPART_THRESHOLD = 64 << 20
"""Files at least this large are uploaded in parts (in parallel, each with its own CRC-32)."""
CONCURRENCY = 16
"""Requests in flight at once (uploads, downloads, deletes)."""
_MAX_PARTS = 10_000


def load_s3fs() -> None:
    """Import s3fs (ImportError naming the extra without it) and botocore's exceptions."""
    try:
        importlib.import_module("s3fs")  # fsspec finds it; imported here for the hint
    except ImportError:
        raise ImportError("s3:// needs s3fs: pip install 'atomic_ckpt[s3]'") from None
    global _BOTOCORE  # noqa: PLW0603 (imported with s3fs, which needs it)
    _BOTOCORE = importlib.import_module("botocore.exceptions")


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


def _is_no_such_bucket(exc: BaseException) -> bool:
    return _client_error(exc)[1] == "NoSuchBucket"


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
        except FileNotFoundError as exc:
            # s3fs makes NoSuchBucket a FileNotFoundError, like NoSuchKey: told apart
            # here, so that no caller reads a missing bucket as a missing checkpoint.
            if _is_no_such_bucket(exc):
                raise NoSuchBucketError(
                    f"{self.url}: the bucket {self.bucket!r} does not exist"
                    f"{self._where()}: create it, or check the URL and the endpoint",
                    path=None,
                ) from exc
            raise

    def _where(self) -> str:
        endpoint = getattr(getattr(self.fs, "s3", None), "meta", None)
        url = getattr(endpoint, "endpoint_url", None)
        return f" at {url}" if url else ""

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
                data = read_range(f.path, 0, f.size)
                out = await self._call("put_object", Key=key, Body=data, ChecksumAlgorithm="CRC32")
            return f.key, str(out["ETag"])
        part = max(self.part_size, -(-f.size // _MAX_PARTS))
        mpu = await self._call("create_multipart_upload", Key=key, ChecksumAlgorithm="CRC32")
        upload_id = mpu["UploadId"]
        try:

            async def one(number: int, offset: int) -> dict[str, Any]:
                async with limit:
                    data = read_range(f.path, offset, min(part, f.size - offset))
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
