"""Reaching a gs:// or az:// root, and naming one (issue 33, third attack): an endpoint
nothing answers on fails after a bounded number of connection tries, each bounded by
``connection_timeout``, with a ConnectionError naming the endpoint and what to check
(the clients' own retries took 72-120 s); those bounds are storage_options; a root URL
that names no bucket, or a bucket no store could hold, is a ValueError naming the form
a root takes, before any request; a misconfigured option or credential names the root."""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import urllib3.util.connection
from _emulators import AZURITE_ACCOUNT, AZURITE_KEY, Emulator, free_port, importable

from atomic_ckpt.cli import main
from atomic_ckpt.remote import RemoteCheckpointDir, UnsupportedStoreError

SCHEMES = ["gs", "az"]


def _need(scheme: str) -> None:
    module = "google.cloud.storage" if scheme == "gs" else "azure.storage.blob"
    if not importable(module):
        pytest.skip(f"{module} is not installed")


def _dead_options(scheme: str, endpoint: str, **extra: Any) -> dict[str, Any]:
    """storage_options pointing a root at ``endpoint``, as for the emulators."""
    if scheme == "gs":
        return {"endpoint_url": endpoint, **extra}
    return {
        "connection_string": (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
            f"AccountKey={AZURITE_KEY};BlobEndpoint={endpoint}/{AZURITE_ACCOUNT};"
        ),
        **extra,
    }


class _Connects:
    """Every connection the test's thread tries (its timeout), and every sleep it makes
    between tries (google-cloud-storage 3 also reads the bucket's metadata from a thread
    of its own, which tries on its own: not counted)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.timeouts: list[Any] = []
        self.slept: list[float] = []
        me = threading.get_ident()
        real_connect, real_sleep = urllib3.util.connection.create_connection, time.sleep

        def connect(address: Any, timeout: Any = None, *a: Any, **kw: Any) -> Any:
            if threading.get_ident() == me:
                self.timeouts.append(timeout)
            return real_connect(address, timeout, *a, **kw)

        def sleep(seconds: float) -> None:
            if threading.get_ident() == me:
                self.slept.append(seconds)
            else:
                real_sleep(seconds)

        monkeypatch.setattr(urllib3.util.connection, "create_connection", connect)
        monkeypatch.setattr("time.sleep", sleep)


@pytest.fixture
def dead_endpoint() -> str:
    """An endpoint on 127.0.0.1 that refuses connections (a port nothing listens on)."""
    return f"http://127.0.0.1:{free_port()}"


@pytest.mark.parametrize("scheme", SCHEMES)
def test_an_endpoint_nothing_answers_on_fails_after_bounded_tries_naming_it(
    scheme: str, dead_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the default settings a refused connection is tried 4 times (3 retries, 0.5 s,
    1 s, 2 s... of backoff: 3.5 s of sleep at most, no client retry on top), each
    connection waiting 5 s at most; the error is a ConnectionError naming the root, the
    endpoint and the options to check, and the CLI exits 2 with it."""
    _need(scheme)
    tries = _Connects(monkeypatch)
    rdir = RemoteCheckpointDir(
        f"{scheme}://bucket/run", storage_options=_dead_options(scheme, dead_endpoint)
    )
    with pytest.raises(ConnectionError) as caught:
        rdir.steps()
    message = str(caught.value)
    assert f"{scheme}://bucket/run" in message
    assert dead_endpoint in message
    assert "refused" in message.lower()
    assert "endpoint_url" in message if scheme == "gs" else "BlobEndpoint" in message
    assert "connection_timeout" in message
    assert "connect_retries" in message
    assert len(tries.timeouts) == 4, tries.timeouts
    assert set(tries.timeouts) == {5.0}
    assert sum(tries.slept) <= 3.5, tries.slept


@pytest.mark.parametrize("scheme", SCHEMES)
def test_connection_timeout_and_connect_retries_are_storage_options(
    scheme: str, dead_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """connect_retries=0: one connection try and no sleep; connection_timeout bounds each
    connection; read_timeout is accepted; each refused with a ValueError naming it when
    it is no positive number (connect_retries: an int >= 0), or not a finite one that a
    socket can wait (inf and 1e300 failed every request with a bare OverflowError)."""
    _need(scheme)
    tries = _Connects(monkeypatch)
    options = _dead_options(
        scheme, dead_endpoint, connection_timeout=1.5, connect_retries=0, read_timeout=30
    )
    rdir = RemoteCheckpointDir(f"{scheme}://bucket/run", storage_options=options)
    with pytest.raises(ConnectionError, match="1 try"):
        rdir.get(1)
    assert tries.timeouts == [1.5]
    assert tries.slept == []
    for name, bad in [
        ("connection_timeout", 0),
        ("read_timeout", -1),
        ("connect_retries", -1),
        ("connect_retries", 1.5),
        ("connection_timeout", "5"),
        ("connection_timeout", math.inf),
        ("read_timeout", 1e300),
        ("read_timeout", math.nan),
    ]:
        with pytest.raises(ValueError, match=name):
            RemoteCheckpointDir(
                f"{scheme}://bucket/run",
                storage_options=_dead_options(scheme, dead_endpoint, **{name: bad}),
            )


def test_a_dead_endpoint_in_the_cli_exits_2_in_one_line(
    dead_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``atomic-ckpt ls`` on a gs:// root whose endpoint refuses connections exits 2,
    printing the endpoint."""
    _need("gs")
    options = json.dumps({"endpoint_url": dead_endpoint, "connect_retries": 0})
    assert main(["ls", "gs://bucket/run", "--storage-options", options]) == 2
    assert dead_endpoint in capsys.readouterr().err


# ---------------------------------------------------------------- naming a root


@pytest.mark.parametrize(
    ("url", "form"),
    [
        ("gs:///run", "gs://BUCKET/PREFIX"),
        ("gs://", "gs://BUCKET/PREFIX"),
        ("gs:////", "gs://BUCKET/PREFIX"),
        ("gcs:///run", "gcs://BUCKET/PREFIX"),
        ("gs://Bad_Bucket!/run", "gs://BUCKET/PREFIX"),
        ("gs://ab/run", "gs://BUCKET/PREFIX"),
        ("gs://b#x/run", "gs://BUCKET/PREFIX"),
        ("gs://bucket/run//x", "gs://BUCKET/PREFIX"),
        ("az:///run", "az://CONTAINER/PREFIX"),
        ("abfs:///run", "abfs://CONTAINER/PREFIX"),
        ("az://Bad_C/run", "az://CONTAINER/PREFIX"),
        ("az://a--b/run", "az://CONTAINER/PREFIX"),
        ("az://" + "a-" * 32 + "a/run", "az://CONTAINER/PREFIX"),  # 65 characters
        ("gs://" + "a" * 64 + ".b/run", "gs://BUCKET/PREFIX"),  # a dotted part over 63
        ("gs://a..b/run", "gs://BUCKET/PREFIX"),
        ("az://container@/run", "az://CONTAINER/PREFIX"),
        ("az://container/a//b", "az://CONTAINER/PREFIX"),
        ("s3:///run", "s3://BUCKET/PREFIX"),
        ("s3://bucket/a//b", "s3://BUCKET/PREFIX"),
    ],
)
def test_a_root_that_names_no_valid_bucket_is_a_value_error_naming_the_form(
    url: str, form: str
) -> None:
    """``gs:///run`` was read as the bucket "run" (a NoSuchBucketError, or a checkpoint in
    the wrong bucket); a bucket name no store accepts failed at the first request with the
    client's message. Each is refused when the root is opened, naming the form."""
    _need("gs")
    _need("az")
    if url.startswith("s3") and not importable("s3fs"):
        pytest.skip("s3fs is not installed")
    with pytest.raises(ValueError, match=form) as caught:
        RemoteCheckpointDir(url, storage_options={})
    assert url in str(caught.value)


@pytest.mark.parametrize(
    "url",
    [
        "gs://bucket",
        "gs://bucket/",
        "gs://bucket/run/",
        "gs://my.bucket_1-x/a/b",
        "gs://abc/r",
        "gs://" + "a" * 63,
        "gs://" + ".".join(["a" * 63] * 3) + "/r",
        "gs://bucket/ünï côde/r",
        "az://$root/r",
        "az://" + "a-" * 31 + "a/r",  # 63 characters
        "az://abc/ü",
    ],
)
def test_a_valid_root_opens_whatever_its_trailing_slash(url: str) -> None:
    """A bucket alone, with a trailing slash, a nested prefix, dots and underscores (GCS),
    Azure's ``$root`` container: each opens (no request is made yet)."""
    _need("gs")
    _need("az")
    options = (
        {"endpoint_url": "http://127.0.0.1:9"}
        if url.startswith("gs")
        else {"connection_string": _dead_options("az", "http://127.0.0.1:9")["connection_string"]}
    )
    assert RemoteCheckpointDir(url, storage_options=options).url == url.rstrip("/")


# ---------------------------------------------------------------- options naming the root


def test_misconfigured_options_name_the_root(tmp_path: Path) -> None:
    """An endpoint_url without http(s)://, a malformed connection string, a missing
    service-account file, an account without credentials: each error names the root and
    the option, instead of the client's bare message."""
    _need("gs")
    _need("az")
    cases: list[tuple[str, dict[str, Any], type[Exception], str]] = [
        ("gs://bucket/run", {"endpoint_url": "127.0.0.1:4443"}, ValueError, "endpoint_url"),
        ("gs://bucket/run", {"token": str(tmp_path / "no.json")}, PermissionError, "no.json"),
        ("gs://bucket/run", {"token": 5, "endpoint_url": "http://h"}, ValueError, "token"),
        ("az://c0ntainer/run", {"connection_string": "garbage"}, ValueError, "connection_string"),
        (
            "az://c0ntainer/run",
            {"account_name": "acct", "endpoint_url": "localhost:10000"},
            ValueError,
            "endpoint_url",
        ),
    ]
    for url, options, kind, names in cases:
        with pytest.raises(kind, match=names) as caught:
            RemoteCheckpointDir(url, storage_options=options)
        assert url in str(caught.value), (options, caught.value)
        assert not isinstance(caught.value, UnsupportedStoreError)


def test_an_azure_account_without_credentials_names_the_root(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """account_name with no key, SAS or credential and no azure-identity: a PermissionError
    naming the root."""
    _need("az")
    import importlib

    real = importlib.import_module

    def no_identity(name: str, *a: Any) -> Any:
        if name == "azure.identity":
            raise ImportError(name)
        return real(name, *a)

    monkeypatch.setattr(importlib, "import_module", no_identity)
    for var in ("AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(PermissionError, match="az://c0ntainer/run"):
        RemoteCheckpointDir("az://c0ntainer/run", storage_options={"account_name": "acct"})


def test_a_bucket_name_is_checked_against_the_emulators_too(
    gs_server: Emulator, az_server: Emulator
) -> None:
    """The name rules are the stores': the emulators' buckets (t-<hex>) pass them."""
    for server in (gs_server, az_server):
        rdir = RemoteCheckpointDir(
            f"{server.scheme}://{server.new_bucket()}/", storage_options=server.options()
        )
        assert rdir.steps() == []


class _LateReader:
    """A server that, for each connection, reads the request's headers, waits ``pause``
    seconds before reading its body (a server busy, a link stalled: the client's send
    blocks once the buffers are full), then answers 200. ``requests`` counts the bodies
    it read whole."""

    def __init__(self, pause: float) -> None:
        import socket

        self.pause, self.requests = pause, 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: Any) -> None:
        with conn, conn.makefile("rb") as f:
            length = 0
            while (line := f.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            time.sleep(self.pause)
            if len(f.read(length)) == length:
                self.requests += 1
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")

    def stop(self) -> None:
        self.listener.close()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_body_the_server_reads_late_is_sent_once_within_the_read_timeout(
    scheme: str,
) -> None:
    """connection_timeout bounds making a connection, not sending a request: a 32 MiB body
    the server starts reading only after 2.5 s (past connection_timeout=1, within the
    read timeout) is sent once and answered. It was cut off at connection_timeout (the
    body went under urllib3's connect timeout), so a large upload over a link stalled
    for 5 s (the default) was sent again, or failed."""
    _need(scheme)
    server = _LateReader(pause=2.5)
    try:
        options = _dead_options(scheme, server.endpoint, connection_timeout=1, read_timeout=30)
        store = RemoteCheckpointDir(f"{scheme}://bucket/run", storage_options=options)._store
        answer = store.session.put(  # type: ignore[attr-defined]
            f"{server.endpoint}/bucket/object", data=b"x" * (32 << 20), timeout=60
        )
        assert answer.status_code == 200
        assert server.requests == 1
    finally:
        server.stop()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_proxy_nothing_answers_on_fails_as_fast_naming_it(
    scheme: str, dead_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTP(S)_PROXY naming a port nothing listens on: nothing was sent, so it is the same
    bounded ConnectionError as a dead endpoint, naming the proxy (it was requests'
    ProxyError, which the clients retried for a minute or two: GCS 120 s)."""
    _need(scheme)
    proxy = f"http://127.0.0.1:{free_port()}"
    for var in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HTTP_PROXY", proxy)
    monkeypatch.setenv("HTTPS_PROXY", proxy)
    options = _dead_options(scheme, dead_endpoint, connect_retries=0, retry_deadline=2)
    if scheme == "az":  # the SDK's retries would take a minute before the fix
        from azure.storage.blob import LinearRetry

        options["client_kwargs"] = {
            "retry_policy": LinearRetry(backoff=0.05, random_jitter_range=0, retry_total=2)
        }
    rdir = RemoteCheckpointDir(f"{scheme}://bucket/run", storage_options=options)
    with pytest.raises(ConnectionError, match="proxy") as caught:
        rdir.steps()
    assert proxy in str(caught.value), caught.value
