"""Azure Blob Storage as a :class:`~._store.Store`: :class:`AzureStore`, on the official
client (azure-storage-blob).

The commit point's conditional writes are Put Blob with ``If-None-Match: *``
(create-only: the service answers 409 ``BlobAlreadyExists``) or ``If-Match: <etag>``
(412 ``ConditionNotMet``); both become :class:`~._store.PreconditionFailed`.
Large files are block blobs: blocks staged in parallel, each with its own
Content-MD5 the service checks, then one Put Block List makes the blob appear
whole. A missing container is :class:`~._store.NoSuchBucketError`, 401/403 a
PermissionError, transport failures OSErrors.
"""

from __future__ import annotations

import base64
import copy
import functools
import importlib
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from atomic_ckpt.remote._store import (
    DeadlineExceeded,
    EndpointUnreachable,
    NoSuchBucketError,
    ObjectInfo,
    PreconditionFailed,
    Store,
    Upload,
    read_range,
    run_parallel,
)

# The Azure client's types are partial: imported as modules of type Any, so that
# mypy --strict needs no override for them.
_A: dict[str, Any] = {}
"""azure.storage.blob and azure.core, once an az:// store is opened (:func:`load_azure`)."""

_OPTIONS = (
    "connection_string",
    "account_name",
    "account_key",
    "credential",
    "sas_token",
    "anon",
    "account_host",
    "endpoint_url",
    "client_kwargs",
    "connection_timeout",
    "read_timeout",
    "connect_retries",
    "retry_deadline",
)
_HINT = (
    "check the endpoint (the connection string's BlobEndpoint, or storage_options "
    "endpoint_url, account_host or account_name), that the server is running and that "
    "this machine reaches it"
)


def load_azure() -> None:
    """Import azure-storage-blob (ImportError naming the extra without it)."""
    if _A:
        return
    try:
        _A["blob"] = importlib.import_module("azure.storage.blob")
        _A["exc"] = importlib.import_module("azure.core.exceptions")
        _A["core"] = importlib.import_module("azure.core")
        _A["transport"] = importlib.import_module("azure.core.pipeline.transport")
        _A["requests"] = importlib.import_module("requests")
    except ImportError:
        _A.clear()
        raise ImportError(
            "az:// needs azure-storage-blob: pip install 'atomic_ckpt[azure]'"
        ) from None


def _split(url: str, root: str) -> tuple[str, str | None, str]:
    """(container, account host or None, prefix) of ``container[@host]/prefix``."""
    first, _, rest = root.strip("/").partition("/")
    container, _, host = first.partition("@")
    if not container:
        raise ValueError(f"{url}: name a container (az://container/prefix)")
    return container, host or None, rest.strip("/")


def open_azure(url: str, root: str, options: dict[str, Any]) -> AzureStore:
    """The store of ``az://container/prefix`` with adlfs's ``storage_options``."""
    load_azure()
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise ValueError(
            f"{url}: unknown storage_options {unknown} for az:// (it takes {list(_OPTIONS)})"
        )
    from atomic_ckpt.remote import _http

    reach = _http.Reach.from_options(url, options)
    container, host, prefix = _split(url, root)
    env = os.environ
    session = _A["requests"].Session()
    kwargs: dict[str, Any] = {
        "transport": _A["transport"].RequestsTransport(session=session, session_owner=False),
        # The SDK's default retry sleeps 15 s, then 18 s, 24 s: within retry_deadline (30 s
        # by default) that is one retry. 1 s, 3 s, 5 s, 9 s... apart, a restart of a few
        # seconds is ridden out (_bounded ends the tries at the deadline).
        "retry_policy": _A["blob"].ExponentialRetry(
            initial_backoff=1, increment_base=2, retry_total=10, random_jitter_range=0.5
        ),
        **(options.get("client_kwargs") or {}),
    }
    kwargs["retry_policy"] = _bounded(kwargs["retry_policy"], reach)
    service = _A["blob"].BlobServiceClient
    # As adlfs: a connection_string option is used first, whatever else is given (an
    # account_name beside it names the same account); the environment's connection string
    # only when the options name no account of their own.
    connection = options.get("connection_string") or (
        None if options.get("account_name") else env.get("AZURE_STORAGE_CONNECTION_STRING")
    )
    if connection:
        _same_account(url, connection, options.get("account_name"))
        try:
            client = service.from_connection_string(connection, **kwargs)
        except ValueError as exc:
            source = (
                "connection_string"
                if options.get("connection_string")
                else "AZURE_STORAGE_CONNECTION_STRING"
            )
            raise ValueError(
                f"{url}: {source} is not a connection string the client reads ({exc}): it is "
                "'DefaultEndpointsProtocol=https;AccountName=...;AccountKey=...;"
                "EndpointSuffix=core.windows.net' (or with BlobEndpoint=...)"
            ) from None
    else:
        account = options.get("account_name") or env.get("AZURE_STORAGE_ACCOUNT_NAME")
        endpoint = options.get("endpoint_url")
        if not endpoint:
            host = host or options.get("account_host")
            if not host and not account:
                raise ValueError(
                    f"{url}: name the storage account: storage_options connection_string, "
                    "or account_name (with account_key, sas_token or credential)"
                )
            endpoint = f"https://{host or f'{account}.blob.core.windows.net'}"
        else:
            _http.check_endpoint(url, "endpoint_url", endpoint)
        credential = _credential(url, options, account)
        try:
            client = service(endpoint, credential=credential, **kwargs)
        except ValueError as exc:
            raise ValueError(f"{url}: {exc}") from None
    _http.mount(session, reach, _HINT)
    return AzureStore(url, client, container, prefix, session)


def _same_account(url: str, connection: str, account: str | None) -> None:
    """Refuse an ``account_name`` that contradicts the connection string's AccountName:
    the connection string is the one used, so the account named beside it would be
    silently ignored."""
    if not account or not isinstance(connection, str):
        return
    fields = dict(
        (k.strip().lower(), v.strip())
        for k, _, v in (part.partition("=") for part in connection.split(";"))
    )
    named = fields.get("accountname")
    if named and named != account:
        raise ValueError(
            f"{url}: storage_options account_name {account!r} is not the connection "
            f"string's AccountName {named!r}: the connection string is used, so drop "
            "account_name or make the two agree"
        )


def _bounded(policy: Any, reach: Any) -> Any:
    """``policy`` (the client's retry policy, ours or the caller's) whose sleeps between
    tries end with what is left of ``retry_deadline`` (the next try then fails at once)."""
    from atomic_ckpt.remote import _http

    policy = copy.copy(policy)  # a caller's policy object stays as it was
    backoff = policy.get_backoff_time
    policy.get_backoff_time = lambda settings: _http.retry_sleep(backoff(settings), reach)
    return policy


def _credential(url: str, options: dict[str, Any], account: str | None) -> Any:
    if options.get("anon"):
        return None
    if options.get("credential") is not None:
        return options["credential"]
    key = options.get("account_key") or os.environ.get("AZURE_STORAGE_ACCOUNT_KEY")
    if key:
        return {"account_name": account, "account_key": key} if account else key
    sas = options.get("sas_token") or os.environ.get("AZURE_STORAGE_SAS_TOKEN")
    if sas:
        return sas
    try:  # as adlfs: the environment's identity (managed identity, az login, ...)
        return importlib.import_module("azure.identity").DefaultAzureCredential()
    except ImportError:
        raise PermissionError(
            f"{url}: no Azure credentials: pass storage_options account_key, sas_token, credential "
            "or connection_string (or anon=True), or pip install azure-identity for "
            "DefaultAzureCredential"
        ) from None


def _block_id(number: int) -> str:
    return base64.b64encode(f"{number:08d}".encode()).decode()


class AzureStore(Store):
    """An Azure Blob container (or Azurite), through azure-storage-blob.

    Every request goes through ``session`` (a requests.Session); uploads,
    downloads and deletes run ``concurrency`` at a time in threads.
    """

    def __init__(self, url: str, client: Any, container: str, base: str, session: Any) -> None:
        super().__init__(url, client, f"{container}/{base}")
        self.container_name = container
        self.container = client.get_container_client(container)
        self.base = base
        self.session = session

    def _key(self, key: str) -> str:
        return f"{self.base}/{key}" if self.base else key

    def _rel(self, full: str) -> str:
        return full[len(self.base) + 1 :] if self.base else full

    def _prefix(self, prefix: str) -> str:
        return self._key(prefix) if prefix else (f"{self.base}/" if self.base else "")

    def _blob(self, key: str) -> Any:
        return self.container.get_blob_client(self._key(key))

    def _call(
        self, what: str, fn: Callable[[], Any], *, missing_ok: bool = False, listing: bool = False
    ) -> Any:
        """``fn()`` with the client's errors as this library's: None for a missing blob
        (``missing_ok``), NoSuchBucketError, PermissionError, OSError. Only a 404 with
        ``BlobNotFound`` is a missing blob: any other (``ContainerNotFound``, a listing's
        404, or no Azure error code at all: a wrong endpoint) means no container there,
        never "no such checkpoint"."""
        from atomic_ckpt.remote import _http

        exc = _A["exc"]
        _http.begin_operation()
        try:
            return fn()
        except EndpointUnreachable as err:
            raise ConnectionError(f"{self.url}: {what}: {err}") from err
        except DeadlineExceeded as err:
            raise TimeoutError(f"{self.url}: {what}: {err}") from err
        except exc.ResourceNotFoundError as err:
            code = str(getattr(err, "error_code", ""))
            if listing or not code.endswith("BlobNotFound"):
                raise NoSuchBucketError(
                    f"{self.url}: the container {self.container_name!r} does not exist at "
                    f"{self.fs.url}: create it, or check the URL, the account and the endpoint",
                    path=None,
                ) from err
            if missing_ok:
                return None
            raise FileNotFoundError(f"{self.url}: {what}: not found") from err
        except exc.ClientAuthenticationError as err:
            raise self._denied(what, err) from err
        except exc.HttpResponseError as err:
            if err.status_code in (401, 403):
                raise self._denied(what, err) from err
            raise OSError(f"{self.url}: {what} failed: {err.status_code} {err.reason}") from err
        except exc.AzureError as err:  # transport: ServiceRequestError, ServiceResponseError
            raise OSError(f"{self.url}: {what} failed: {err}") from err

    def _denied(self, what: str, err: Any) -> PermissionError:
        check = (
            "check the credentials (storage_options account_key, sas_token, credential or "
            "connection_string)"
        )
        status = getattr(err, "status_code", None)
        if status is None:
            # No answer at all: the client refused to sign the request (AzureSigningError,
            # e.g. an account key that is not base64: a truncated copy of it). It has no
            # error_code either.
            return PermissionError(
                f"{self.url}: {what}: the client could not sign the request with the "
                f"account key ({getattr(err, 'message', err)}): {check}; an account key is "
                "base64, usually ending in '=='"
            )
        code = getattr(err, "error_code", None)
        return PermissionError(
            f"{self.url}: {what}: access denied ({status} {getattr(code, 'value', code)}): {check}"
        )

    # ------------------------------------------------------------ the commit point

    def conditional_path(self, size: int) -> str:
        # upload_blob's rule: past max_single_put_size, staged blocks and a Put Block List.
        limit = getattr(getattr(self.fs, "_config", None), "max_single_put_size", 64 << 20)
        if size > limit:
            return f"staged blocks and a Put Block List (over {limit} bytes)"
        return "Put Blob"

    def create(self, key: str, data: bytes) -> str:
        def go() -> Any:
            try:  # overwrite=False: If-None-Match: *
                return self._blob(key).upload_blob(data, overwrite=False, validate_content=True)
            except _A["exc"].ResourceExistsError as err:  # 409 BlobAlreadyExists
                raise PreconditionFailed(self.url_of(key)) from err

        out = self._call(f"create-only write of {key}", go)
        return str(out["etag"])

    def replace(self, key: str, data: bytes, etag: str) -> str:
        def go() -> Any:
            try:
                return self._blob(key).upload_blob(
                    data,
                    overwrite=True,
                    validate_content=True,
                    etag=etag,
                    match_condition=_A["core"].MatchConditions.IfNotModified,  # If-Match
                )
            except _A["exc"].ResourceModifiedError as err:  # 412 ConditionNotMet
                raise PreconditionFailed(self.url_of(key)) from err
            except _A["exc"].ResourceNotFoundError as err:
                if str(getattr(err, "error_code", "")).endswith("BlobNotFound"):
                    raise PreconditionFailed(self.url_of(key)) from err
                raise

        out = self._call(f"conditional write of {key}", go)
        return str(out["etag"])

    # ------------------------------------------------------------ objects

    def upload(self, files: Sequence[Upload]) -> dict[str, str]:
        bad = [f.key.partition("/")[2].partition("/")[2] for f in files if "\\" in f.key]
        if bad:  # the service reads a backslash in a blob's name as "/"
            raise ValueError(
                f"{self.url}: Azure Blob Storage stores a '\\' in a blob name as '/', so "
                f"'{bad[0]}' could not be found again under its name: rename it"
                + (f" (and {len(bad) - 1} more)" if bad[1:] else "")
            )
        small = [(f,) for f in files if f.size < self.multipart_threshold]
        out = dict(run_parallel(self._put, small, self.concurrency))
        for f in files:  # each large one's blocks in parallel
            if f.size >= self.multipart_threshold:
                out[f.key] = self._blocks(f)
        return out

    def _put(self, f: Upload) -> tuple[str, str]:
        data = read_range(f.path, 0, f.size)
        out = self._call(
            f"upload of {f.key}",
            lambda: self._blob(f.key).upload_blob(data, overwrite=True, validate_content=True),
        )
        return f.key, str(out["etag"])

    def _blocks(self, f: Upload) -> str:
        blob = self._blob(f.key)
        offsets = list(range(0, f.size, self.part_size))

        def stage(number: int, offset: int) -> None:
            data = read_range(f.path, offset, min(self.part_size, f.size - offset))
            self._call(
                f"block {number} of {f.key}",
                # validate_content: the block's Content-MD5, checked by the service.
                lambda: blob.stage_block(_block_id(number), data, validate_content=True),
            )

        run_parallel(stage, list(enumerate(offsets)), self.concurrency)
        blocks = [_A["blob"].BlobBlock(_block_id(n)) for n in range(len(offsets))]
        out = self._call(f"block list of {f.key}", lambda: blob.commit_block_list(blocks))
        return str(out["etag"])

    def get(self, key: str) -> tuple[bytes, str] | None:
        def go() -> tuple[bytes, str]:
            stream = self._blob(key).download_blob(validate_content=True)
            return bytes(stream.readall()), str(stream.properties.etag)

        out: tuple[bytes, str] | None = self._call(f"read of {key}", go, missing_ok=True)
        return out

    def _walk(self, prefix: str, delimiter: bool, uncommitted: bool = False) -> list[Any]:
        include = ["uncommittedblobs"] if uncommitted else None
        start = self._prefix(prefix)

        def go() -> list[Any]:
            if delimiter:
                return list(self.container.walk_blobs(name_starts_with=start, delimiter="/"))
            return list(self.container.list_blobs(name_starts_with=start, include=include))

        out: list[Any] = self._call(f"listing of {prefix or 'the root'}", go, listing=True)
        return out

    def find(self, prefix: str) -> dict[str, ObjectInfo]:
        return {
            (key := self._rel(b.name)): ObjectInfo(
                key, int(b.size), str(b.etag), b.last_modified.timestamp()
            )
            for b in self._walk(prefix, False)
        }

    def children(self, prefix: str) -> list[str]:
        start = len(self._prefix(prefix))
        return sorted(n for b in self._walk(prefix, True) if (n := b.name[start:].rstrip("/")))

    def download(self, pairs: Sequence[tuple[str, Path]]) -> None:
        def one(key: str, dest: Path) -> None:
            with open(dest, "xb") as f:
                self._call(
                    f"download of {key}",
                    lambda: self._blob(key).download_blob(max_concurrency=1).readinto(f),
                )

        run_parallel(one, pairs, self.concurrency)

    def delete(self, keys: Iterable[str]) -> None:
        def one(key: str) -> None:
            self._call(f"delete of {key}", lambda: self._blob(key).delete_blob(), missing_ok=True)

        run_parallel(one, [(k,) for k in keys], self.concurrency)

    # ------------------------------------------------------------ staged blocks

    def live_uploads(self, prefix: str) -> dict[str, float]:
        """Blobs with staged blocks and no committed block list (a block upload under way
        or abandoned): key -> when its first block was staged."""
        committed = {b.name for b in self._walk(prefix, False)}
        return {
            self._rel(b.name): b.last_modified.timestamp()
            for b in self._walk(prefix, False, uncommitted=True)
            if b.name not in committed
        }

    def stale_uploads(self, prefix: str, older_than: float) -> list[tuple[str, str]]:
        return [(k, "") for k, t in self.live_uploads(prefix).items() if t < older_than]

    def abort_uploads(self, uploads: Sequence[tuple[str, str]]) -> None:
        """Discard abandoned staged blocks: an empty block list commits (and drops them),
        then the empty blob is deleted."""
        for key, _ in uploads:
            blob = self._blob(key)
            self._call(
                f"discarding the blocks of {key}", functools.partial(blob.commit_block_list, [])
            )
            self._call(f"delete of {key}", blob.delete_blob, missing_ok=True)
