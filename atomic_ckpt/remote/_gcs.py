"""Google Cloud Storage as a :class:`~._store.Store`: :class:`GCSStore`, on the official
client (google-cloud-storage, the JSON API).

The "ETag" the protocol carries is the object's generation. The commit point's
conditional writes are uploads with ``ifGenerationMatch=0`` (create-only) or
``ifGenerationMatch=<generation>`` (replace-if-unchanged), always a multipart or
resumable upload (the paths whose precondition every server checked enforces; the
bare ``uploadType=media`` path is never used). HTTP 412 becomes
:class:`~._store.PreconditionFailed`; 429 and 5xx are retried by the client; a
missing bucket is :class:`~._store.NoSuchBucketError`, 401/403 a PermissionError,
transport failures OSErrors. Every upload carries the object's CRC32C: a small file's
multipart upload in its metadata (the server refuses a mismatch); a large file goes as a
resumable upload in chunks (the JSON API checks no single chunk), the CRC32C with its
last chunk where the client sends it (google-cloud-storage 3). Either way the client
compares the CRC32C the server reports for the stored object with the bytes it sent: a
mismatch is an OSError, before the commit point.
"""

from __future__ import annotations

import importlib
import os
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from atomic_ckpt.remote._store import (
    DeadlineExceeded,
    EndpointUnreachable,
    NoSuchBucketError,
    ObjectInfo,
    PreconditionFailed,
    Store,
    Upload,
    run_parallel,
)

T = TypeVar("T")

# The Google client ships partial type information: imported as modules of type Any, so
# that mypy --strict needs no override for them.
_G: dict[str, Any] = {}
"""google.cloud.storage and friends, once a gs:// store is opened (:func:`load_gcs`)."""

_CHUNK = 256 << 10
"""A resumable upload's chunks are a multiple of this (the JSON API's rule)."""
_OPTIONS = (
    "endpoint_url",
    "token",
    "project",
    "client_kwargs",
    "connection_timeout",
    "read_timeout",
    "connect_retries",
    "retry_deadline",
)
_HINT = (
    "check the endpoint (storage_options endpoint_url, or STORAGE_EMULATOR_HOST; neither: "
    "Google Cloud Storage itself), that the server is running and that this machine "
    "reaches it"
)


def load_gcs() -> None:
    """Import google-cloud-storage (ImportError naming the extra without it)."""
    if _G:
        return
    try:
        _G["storage"] = importlib.import_module("google.cloud.storage")
        _G["blob"] = importlib.import_module("google.cloud.storage.blob")
        _G["exc"] = importlib.import_module("google.api_core.exceptions")
        _G["retry"] = importlib.import_module("google.cloud.storage.retry")
        _G["credentials"] = importlib.import_module("google.auth.credentials")
        _G["auth"] = importlib.import_module("google.auth")
        _G["service_account"] = importlib.import_module("google.oauth2.service_account")
        _G["corrupt"] = _media_errors()
        exc, requests = _G["exc"], importlib.import_module("requests")
        _G["transient"] = (  # what DEFAULT_RETRY retries (google.cloud.storage.retry)
            *(exc.TooManyRequests, exc.InternalServerError, exc.BadGateway),
            *(exc.ServiceUnavailable, exc.GatewayTimeout, ConnectionError),
            *(requests.ConnectionError, requests.exceptions.ChunkedEncodingError),
            requests.Timeout,
        )
    except ImportError:
        _G.clear()
        raise ImportError(
            "gs:// needs google-cloud-storage: pip install 'atomic_ckpt[gcs]'"
        ) from None


def _media_errors() -> tuple[type[BaseException], ...]:
    """The upload layer's own errors: a checksum that differs from the server's
    (DataCorruption) and an answer it cannot read (InvalidResponse). google-cloud-storage
    3 defines them in google.cloud.storage.exceptions, 2.x in google.resumable_media."""
    found: list[type[BaseException]] = []
    for module in ("google.cloud.storage.exceptions", "google.resumable_media.common"):
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        found += [getattr(mod, n) for n in ("DataCorruption", "InvalidResponse") if hasattr(mod, n)]
    return tuple(found)


def _bare_endpoint(url: str, source: str, endpoint: str) -> str:
    """``endpoint`` as the client takes it: scheme and host only. The client appends
    ``/storage/v1/...`` and ``/upload/storage/v1/...`` to it as a string, so a trailing
    ``/`` made every request ``//upload/...``, a 404 read as a missing bucket: it is
    dropped. A path, query or fragment is refused (the JSON API lives at the root)."""
    from atomic_ckpt.remote import _http

    _http.check_endpoint(url, source, endpoint)
    parts = urllib.parse.urlsplit(endpoint)
    if parts.path.strip("/") or parts.query or parts.fragment:
        raise ValueError(
            f"{url}: {source} {endpoint!r} has a path: the GCS JSON API is at the server's "
            f"root, so give it as {parts.scheme}://{parts.netloc}"
        )
    return f"{parts.scheme}://{parts.netloc}"


def _credentials(url: str, token: Any, endpoint: str | None) -> Any:
    """gcsfs's ``token`` as google-auth credentials (None: the environment's default)."""
    if token is None and endpoint is not None:
        return _G["credentials"].AnonymousCredentials()  # an emulator or a private endpoint
    if token == "anon":
        return _G["credentials"].AnonymousCredentials()
    if token in (None, "google_default", "cloud"):
        return None  # the client looks them up (GOOGLE_APPLICATION_CREDENTIALS, metadata)
    if isinstance(token, _G["credentials"].Credentials):
        return token
    if not isinstance(token, dict | str | os.PathLike):
        raise ValueError(
            f"{url}: storage_options token must be 'anon', 'google_default', a service-account "
            f"JSON file or its dict, or a google.auth Credentials object, not {token!r}"
        )
    accounts = _G["service_account"].Credentials
    try:
        if isinstance(token, dict):
            return accounts.from_service_account_info(token)
        return accounts.from_service_account_file(os.fspath(token))
    except (OSError, ValueError, KeyError) as exc:
        what = "dict" if isinstance(token, dict) else f"file {os.fspath(token)!r}"
        raise PermissionError(
            f"{url}: storage_options token: the service-account {what} gives no credentials "
            f"({type(exc).__name__}: {exc}): pass a service-account key file as Google Cloud "
            "writes it, or token='anon'"
        ) from None


def open_gcs(url: str, root: str, options: dict[str, Any]) -> GCSStore:
    """The store of ``gs://bucket/prefix`` with gcsfs's ``storage_options``."""
    load_gcs()
    from atomic_ckpt.remote import _http

    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise ValueError(
            f"{url}: unknown storage_options {unknown} for gs:// (it takes {list(_OPTIONS)})"
        )
    reach = _http.Reach.from_options(url, options)
    endpoint = options.get("endpoint_url") or os.environ.get("STORAGE_EMULATOR_HOST")
    if endpoint:
        source = "endpoint_url" if options.get("endpoint_url") else "STORAGE_EMULATOR_HOST"
        endpoint = _bare_endpoint(url, source, endpoint)
    kwargs: dict[str, Any] = dict(options.get("client_kwargs") or {})
    if endpoint:
        kwargs["client_options"] = {"api_endpoint": endpoint}
    project = options.get("project")
    credentials = _credentials(url, options.get("token"), endpoint)
    if project is None and isinstance(credentials, _G["credentials"].AnonymousCredentials):
        project = "<none>"  # listing and reading need none; the client insists on one
    try:
        client = _G["storage"].Client(project=project, credentials=credentials, **kwargs)
    except _G["auth"].exceptions.DefaultCredentialsError as exc:
        raise PermissionError(
            f"{url}: no Google credentials found ({exc}): pass storage_options "
            "token=<service account JSON file> or token='anon', or set "
            "GOOGLE_APPLICATION_CREDENTIALS"
        ) from None
    except ValueError as exc:  # e.g. client_kwargs the client refuses
        raise ValueError(f"{url}: {exc}") from None
    store = GCSStore(url, client, root)
    # The client's retry (1 s, 2 s, 4 s... apart) given up after retry_deadline, and never
    # a sleep over a quarter of it (its 60 s would leave one try in the deadline).
    store.retry = store.retry.with_timeout(reach.retry_deadline).with_delay(
        maximum=max(1.0, reach.retry_deadline / 4)
    )
    _http.mount(store.session, reach, _HINT)
    return store


class GCSStore(Store):
    """A GCS bucket (or a server speaking its JSON API), through google-cloud-storage.

    Every request goes through the client's ``requests`` session (``session``);
    uploads, downloads and deletes run ``concurrency`` at a time in threads.
    """

    create_condition = "ifGenerationMatch=0"
    replace_condition = "ifGenerationMatch=<generation>"
    wrong_etag = "123456789"

    def __init__(self, url: str, client: Any, root: str) -> None:
        super().__init__(url, client, root)
        bucket, _, key = self.root.partition("/")
        if not bucket:
            raise ValueError(f"{url}: name a bucket (gs://bucket/prefix)")
        self.bucket_name = bucket
        self.bucket = client.bucket(bucket)
        self.base = key.strip("/")
        self.session: Any = client._http  # the requests.Session every request goes through
        self._bucket_seen = False
        self.retry: Any = _G["retry"].DEFAULT_RETRY
        """The client's retry of 429, 5xx and transport errors, used on every request (the
        conditional writes too: a precondition makes a retried write safe)."""

    def _key(self, key: str) -> str:
        return f"{self.base}/{key}" if self.base else key

    def _rel(self, full: str) -> str:
        return full[len(self.base) + 1 :] if self.base else full

    def _prefix(self, prefix: str) -> str:
        return self._key(prefix) if prefix else (f"{self.base}/" if self.base else "")

    def _endpoint(self) -> str:
        return str(getattr(getattr(self.fs, "_connection", None), "API_BASE_URL", "") or "?")

    def _no_bucket(self) -> NoSuchBucketError:
        endpoint = getattr(self.fs, "_connection", None)
        where = getattr(endpoint, "API_BASE_URL", "")
        return NoSuchBucketError(
            f"{self.url}: the bucket {self.bucket_name!r} does not exist"
            f"{f' at {where}' if where else ''}: create it, or check the URL and the endpoint",
            path=None,
        )

    def _call(
        self, what: str, fn: Callable[[], Any], *, missing_ok: bool = False, write: bool = False
    ) -> Any:
        """``fn()`` with the client's errors as this library's: None for a missing object
        (``missing_ok``), NoSuchBucketError, PermissionError, OSError. A ``write`` (an
        upload) answered 404 in a bucket that exists lost its resumable session (expired,
        or the server restarted): an OSError, never a FileNotFoundError."""
        from atomic_ckpt.remote import _http

        exc_mod = _G["exc"]
        _http.begin_operation()
        try:
            out = fn()
        except EndpointUnreachable as exc:
            raise ConnectionError(f"{self.url}: {what}: {exc}") from exc
        except DeadlineExceeded as exc:
            raise TimeoutError(f"{self.url}: {what}: {exc}") from exc
        except exc_mod.PreconditionFailed as exc:
            raise PreconditionFailed(f"{self.url}: {what}") from exc
        except exc_mod.NotFound as exc:
            if not self._bucket_exists():
                raise self._no_bucket() from exc
            if write:
                raise OSError(
                    f"{self.url}: {what}: the server lost the upload session (it expired, or "
                    f"the server restarted: {exc.code} {exc.message}): commit again"
                ) from exc
            if missing_ok:
                return None
            raise FileNotFoundError(f"{self.url}: {what}: not found") from exc
        except (exc_mod.Unauthorized, exc_mod.Forbidden) as exc:
            raise PermissionError(
                f"{self.url}: {what}: access denied ({exc.code} {exc.message}): check the "
                "credentials (storage_options token) and their roles on the bucket"
            ) from exc
        except (exc_mod.RetryError, *_G["transient"]) as exc:
            # What the client retries, raised: its retry ended at its timeout (the
            # retry_deadline; google-cloud-storage 2.x's uploads and downloads raise the
            # last error, 3.x a RetryError).
            raise TimeoutError(
                f"{self.url}: {what} kept failing at {self._endpoint()} until the "
                f"storage_options retry_deadline ({type(exc).__name__}: {exc}): {_HINT}"
            ) from exc
        except exc_mod.GoogleAPICallError as exc:
            raise OSError(f"{self.url}: {what} failed: {exc.code} {exc.message}") from exc
        except _G["corrupt"] as exc:  # the object's CRC32C is not the bytes' sent
            raise OSError(f"{self.url}: {what} failed: {exc}") from exc
        except _G["auth"].exceptions.TransportError as exc:
            raise OSError(f"{self.url}: {what} failed: {exc}") from exc
        except _G["auth"].exceptions.GoogleAuthError as exc:  # refreshing them failed
            raise PermissionError(
                f"{self.url}: {what}: the credentials were refused ({exc}): check the "
                "credentials (storage_options token)"
            ) from exc
        self._bucket_seen = True
        return out

    def _bucket_exists(self) -> bool:
        if self._bucket_seen:
            return True
        try:
            self.bucket.reload(retry=self.retry)
        except _G["exc"].NotFound:
            return False
        except Exception:
            return True  # unknown: the original error is the better one
        self._bucket_seen = True
        return True

    def _pool(self, fn: Callable[..., T], items: Iterable[Any]) -> list[T]:
        return run_parallel(fn, items, self.concurrency)

    # ------------------------------------------------------------ the commit point

    def _conditional(self, key: str, data: bytes, generation: int) -> str:
        blob = self.bucket.blob(self._key(key))
        # upload_from_string: a multipart upload (resumable past 8 MiB, which
        # conditional_path tells the probe), never uploadType=media.
        self._call(
            f"conditional write of {key}",
            lambda: blob.upload_from_string(
                data,
                content_type="application/octet-stream",
                if_generation_match=generation,
                checksum="crc32c",
                retry=self.retry,
            ),
            write=True,
        )
        return str(blob.generation)

    def conditional_path(self, size: int) -> str:
        # The client's own rule (Blob._do_upload): past this size, a resumable upload.
        limit = getattr(_G["blob"], "_MAX_MULTIPART_SIZE", 8 << 20)
        if size > limit:
            return f"resumable uploads (over {limit} bytes)"
        return "multipart uploads"

    def create(self, key: str, data: bytes) -> str:
        return self._conditional(key, data, 0)

    def replace(self, key: str, data: bytes, etag: str) -> str:
        try:
            generation = int(etag.strip('"'))
        except ValueError:
            raise PreconditionFailed(f"{self.url_of(key)}: {etag!r} is no generation") from None
        return self._conditional(key, data, generation)

    # ------------------------------------------------------------ objects

    def upload(self, files: Sequence[Upload]) -> dict[str, str]:
        return dict(self._pool(self._upload_one, [(f,) for f in files]))

    def _upload_one(self, f: Upload) -> tuple[str, str]:
        big = f.size >= self.multipart_threshold
        chunk = max(_CHUNK, self.part_size // _CHUNK * _CHUNK) if big else None
        blob = self.bucket.blob(self._key(f.key), chunk_size=chunk)
        fd = os.open(f.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as src:
            self._call(
                f"upload of {f.key}",
                lambda: blob.upload_from_file(
                    src,
                    size=f.size,
                    content_type="application/octet-stream",
                    checksum="crc32c",
                    # The key is fresh (a new attempt): a retried write is the same bytes.
                    retry=self.retry,
                ),
                write=True,
            )
        if blob.size != f.size:
            raise OSError(f"{self.url_of(f.key)}: stored {blob.size} bytes, uploaded {f.size}")
        return f.key, str(blob.generation)

    def get(self, key: str) -> tuple[bytes, str] | None:
        blob = self.bucket.blob(self._key(key))
        data = self._call(
            f"read of {key}",
            lambda: blob.download_as_bytes(retry=self.retry),
            missing_ok=True,
        )
        if data is None:
            return None
        return bytes(data), str(blob.generation)

    def _list(self, prefix: str, delimiter: str | None = None) -> tuple[list[Any], list[str]]:
        def go() -> tuple[list[Any], list[str]]:
            found = self.fs.list_blobs(
                self.bucket_name,
                prefix=self._prefix(prefix),
                delimiter=delimiter,
                retry=self.retry,
            )
            blobs = list(found)
            return blobs, sorted(found.prefixes)

        out: tuple[list[Any], list[str]] = self._call(f"listing of {prefix or 'the root'}", go)
        return out

    def find(self, prefix: str) -> dict[str, ObjectInfo]:
        blobs, _ = self._list(prefix)
        return {
            (key := self._rel(b.name)): ObjectInfo(
                key, int(b.size), str(b.generation), b.updated.timestamp()
            )
            for b in blobs
        }

    def children(self, prefix: str) -> list[str]:
        blobs, folders = self._list(prefix, "/")
        start = len(self._prefix(prefix))
        names = [f[start:].rstrip("/") for f in folders] + [b.name[start:] for b in blobs]
        return sorted(n for n in names if n)

    def download(self, pairs: Sequence[tuple[str, Path]]) -> None:
        def one(key: str, dest: Path) -> None:
            blob = self.bucket.blob(self._key(key))
            with open(dest, "xb") as f:  # the client checks the object's CRC32C or MD5
                self._call(
                    f"download of {key}",
                    lambda: blob.download_to_file(f, retry=self.retry),
                )

        self._pool(one, pairs)

    def delete(self, keys: Iterable[str]) -> None:
        def one(key: str) -> None:
            blob = self.bucket.blob(self._key(key))
            self._call(
                f"delete of {key}",
                lambda: blob.delete(retry=self.retry),
                missing_ok=True,
            )

        self._pool(one, [(k,) for k in keys])
