"""Every way a gs:// or az:// root is named and reached: the storage_options gcsfs and adlfs
users know (gs: endpoint_url, token incl. "anon" and a Credentials object, project,
STORAGE_EMULATOR_HOST; az: connection_string, account_name with account_key or
credential, AZURE_STORAGE_CONNECTION_STRING, abfs://), each committing a step that a
root opened the usual way reads back bit-exact; options they do not know are refused;
and ``atomic_ckpt.remote.open``, which opens any root from its name."""

from __future__ import annotations

import http.server
import json
import threading
import uuid
from pathlib import Path
from typing import Any, ClassVar

import pytest
from _emulators import AZURITE_ACCOUNT, AZURITE_KEY, Emulator, importable, missing
from _remote_support import SMALL_PART, read_tree, write_tree

import atomic_ckpt.remote
from atomic_ckpt import CheckpointDir
from atomic_ckpt.cli import main
from atomic_ckpt.remote import RemoteCheckpointDir, UnsupportedStoreError


def _roundtrip(emulator: Emulator, url: str, options: dict[str, Any], tmp: Path) -> None:
    """Commit step 1 to ``url`` with ``options``; a root on the same place opened with the
    emulator's usual options lists it and fetches it bit-exact."""
    rdir = RemoteCheckpointDir(url, storage_options=options, staging_dir=tmp / "staging")
    with rdir.commit(1, metadata={"via": sorted(options)}) as path:
        expected = write_tree(path, 1)
    assert rdir.steps() == [1]
    bucket_and_prefix = url.split("://", 1)[1]
    usual = RemoteCheckpointDir(
        f"{emulator.scheme}://{bucket_and_prefix}", storage_options=emulator.options()
    )
    ckpt = usual.latest()
    assert ckpt is not None
    assert ckpt.manifest.metadata["via"] == sorted(options)
    assert read_tree(usual.fetch(1, tmp / f"got-{uuid.uuid4().hex[:6]}").path) == expected


# ---------------------------------------------------------------- gs://


def _gcs_forms(server: Emulator) -> dict[str, dict[str, Any]]:
    from google.auth.credentials import AnonymousCredentials

    return {
        "endpoint_url": {"endpoint_url": server.endpoint},
        "token=anon": {"endpoint_url": server.endpoint, "token": "anon"},
        "token=anon+project": {"endpoint_url": server.endpoint, "token": "anon", "project": "p1"},
        "token=Credentials": {"endpoint_url": server.endpoint, "token": AnonymousCredentials()},
    }


@pytest.mark.parametrize(
    "form", ["endpoint_url", "token=anon", "token=anon+project", "token=Credentials"]
)
def test_gcs_storage_options(gs_server: Emulator, tmp_path: Path, form: str) -> None:
    """gcsfs's endpoint_url, token ("anon", a google-auth Credentials object) and project."""
    options = _gcs_forms(gs_server)[form]
    _roundtrip(gs_server, f"gs://{gs_server.new_bucket()}/run", options, tmp_path)


def test_gcs_emulator_host_from_the_environment(
    gs_server: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """STORAGE_EMULATOR_HOST (as the Google clients read it) with no storage_options at all,
    and the gcs:// spelling of the scheme."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gs_server.endpoint)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    _roundtrip(gs_server, f"gcs://{gs_server.new_bucket()}/run", {}, tmp_path)


class _TokenServer(http.server.BaseHTTPRequestHandler):
    """An OAuth token endpoint that refuses every grant, as Google's does for a revoked or
    deleted service-account key (400 invalid_grant)."""

    hits: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).hits.append(self.path)
        body = b'{"error": "invalid_grant", "error_description": "Invalid JWT Signature."}'
        self.send_response(400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def _service_account(token_uri: str) -> dict[str, str]:
    """A service-account key (a fresh RSA key) whose tokens come from ``token_uri``."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    return {
        "type": "service_account",
        "project_id": "p1",
        "private_key_id": "k1",
        "private_key": pem,
        "client_email": "trainer@p1.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": token_uri,
    }


def test_refused_gcs_credentials_are_a_permission_error_and_exit_2(
    gs_server: Emulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """token: a service-account JSON file (or its dict) whose token exchange is refused
    (400 invalid_grant from a token server on 127.0.0.1): every call is a PermissionError
    naming the credentials, and ``atomic-ckpt ls`` exits 2 in one line."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _TokenServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        info = _service_account(f"http://127.0.0.1:{server.server_address[1]}/token")
        key_file = tmp_path / "sa.json"
        key_file.write_text(json.dumps(info))
        url = f"gs://{gs_server.new_bucket()}/run"
        for token in (str(key_file), info):
            rdir = RemoteCheckpointDir(
                url, storage_options={"endpoint_url": gs_server.endpoint, "token": token}
            )
            with pytest.raises(PermissionError, match="credentials"):
                rdir.steps()
        opts = json.dumps({"endpoint_url": gs_server.endpoint, "token": str(key_file)})
        _TokenServer.hits.clear()
        assert main(["ls", url, "--storage-options", opts]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert "credentials" in err
        assert _TokenServer.hits, "the token exchange was tried"
    finally:
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------- az://


def _azure_forms(server: Emulator) -> dict[str, dict[str, Any]]:
    from azure.core.credentials import AzureNamedKeyCredential

    blob_endpoint = f"{server.endpoint}/{AZURITE_ACCOUNT}"
    account = {"account_name": AZURITE_ACCOUNT, "endpoint_url": blob_endpoint}
    return {
        "connection_string": {"connection_string": server.connection_string()},
        "account_name+account_key": {**account, "account_key": AZURITE_KEY},
        "account_name+credential": {
            **account,
            "credential": AzureNamedKeyCredential(AZURITE_ACCOUNT, AZURITE_KEY),
        },
    }


@pytest.mark.parametrize(
    "form", ["connection_string", "account_name+account_key", "account_name+credential"]
)
def test_azure_storage_options(az_server: Emulator, tmp_path: Path, form: str) -> None:
    """adlfs's connection_string, or account_name with account_key or a credential object
    (endpoint_url: Azurite's account endpoint, as for any non-default host)."""
    options = _azure_forms(az_server)[form]
    _roundtrip(az_server, f"az://{az_server.new_bucket()}/run", options, tmp_path)


def test_azure_connection_string_from_the_environment_and_abfs(
    az_server: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AZURE_STORAGE_CONNECTION_STRING with no storage_options, and abfs:// for az://."""
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", az_server.connection_string())
    _roundtrip(az_server, f"abfs://{az_server.new_bucket()}/run", {}, tmp_path)


def test_an_account_host_in_the_url_names_the_endpoint() -> None:
    """az://container@host/prefix, as adlfs reads it: the account's host is the endpoint
    (nothing is sent: a client is only built)."""
    pytest.importorskip("azure.storage.blob", reason="the azure extra is not installed")
    rdir = RemoteCheckpointDir(
        "az://ckpts@acct.blob.core.windows.net/run1",
        storage_options={"account_name": "acct", "account_key": AZURITE_KEY},
    )
    assert rdir.fs.url.rstrip("/") == "https://acct.blob.core.windows.net"
    assert rdir._store.container_name == "ckpts"  # type: ignore[attr-defined]
    assert rdir._store.base == "run1"  # type: ignore[attr-defined]


# ---------------------------------------------------------------- refused options


@pytest.mark.parametrize(
    ("url", "options", "match"),
    [
        ("gs://bkt/run", {"endpoint_url": "http://127.0.0.1:9", "key": "x"}, "unknown.*'key'"),
        ("az://ctr/run", {"connection_string": "x", "secret": "y"}, "unknown.*'secret'"),
        ("az://ctr/run", {"account_key": "k"}, "name the storage account"),
        ("gs://", {"token": "anon"}, "no bucket"),
    ],
    ids=["gs-unknown", "az-unknown", "az-no-account", "gs-no-bucket"],
)
def test_options_a_store_does_not_take_are_refused(
    url: str, options: dict[str, Any], match: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An option neither gcsfs nor adlfs users would pass here, or a root naming no account
    or bucket: a ValueError naming what is accepted, before any request."""
    client = "google.cloud.storage" if url[:2] == "gs" else "azure.storage.blob"
    if not importable(client):
        missing(f"needs {client} (the [gcs] or [azure] extra)")
    for name in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_NAME"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match=match):
        RemoteCheckpointDir(url, storage_options=options)


def test_the_cli_refuses_an_unknown_option_in_one_line(
    gs_server: Emulator, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same refusal from ``atomic-ckpt ls``: exit 2, one line."""
    opts = json.dumps({**gs_server.options(), "anon": True})
    assert main(["ls", f"gs://{gs_server.new_bucket()}/run", "--storage-options", opts]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "anon" in err


# ---------------------------------------------------------------- atomic_ckpt.remote.open


@pytest.fixture(params=["s3", "gs", "az", "abfs", "memory"])
def named_root(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any] | None]:
    """A root's URL on each store, and the storage_options that reach it."""
    scheme = request.param
    if scheme == "memory":
        return f"memory://open-{uuid.uuid4().hex}", None
    if scheme == "s3":
        s3 = request.getfixturevalue("s3_server")
        return f"s3://{request.getfixturevalue('bucket')}/run", s3.options()
    server: Emulator = request.getfixturevalue(
        "az_server" if scheme == "abfs" else f"{scheme}_server"
    )
    return f"{scheme}://{server.new_bucket()}/run", server.options()


def test_open_a_url_is_a_remote_root(
    named_root: tuple[str, dict[str, Any] | None], tmp_path: Path
) -> None:
    """atomic_ckpt.remote.open(url, storage_options=..., **options) is the
    RemoteCheckpointDir of that URL, the options passed on (prefix here)."""
    url, options = named_root
    root = atomic_ckpt.remote.open(
        url, storage_options=options, prefix="ckpt-", staging_dir=tmp_path / "staging"
    )
    assert isinstance(root, RemoteCheckpointDir)
    assert root.url == url
    with root.commit(3) as path:
        expected = write_tree(path, 3)
    assert root.url_of(3) == f"{url}/ckpt-3"
    assert root.steps() == [3]
    assert read_tree(root.fetch(3, tmp_path / "got").path) == expected


def test_open_a_path_is_a_local_root(tmp_path: Path) -> None:
    """A path, a str or a file:// URL opens a CheckpointDir (the options passed on); a
    local root with storage_options, or a store with no conditional writes, is refused."""
    for name in (tmp_path / "a", str(tmp_path / "b"), f"file://{tmp_path / 'c'}"):
        root = atomic_ckpt.remote.open(name, prefix="step-")
        assert isinstance(root, CheckpointDir)
        with root.commit(1) as path:
            (path / "x").write_bytes(b"x")
        assert root.steps() == [1]
        assert (Path(str(name).removeprefix("file://")) / "step-1" / "x").read_bytes() == b"x"
    with pytest.raises(ValueError, match="storage_options"):
        atomic_ckpt.remote.open(tmp_path / "d", storage_options={"anon": True})
    with pytest.raises(ValueError, match="this machine"):
        atomic_ckpt.remote.open("file://otherhost/x")
    with pytest.raises(UnsupportedStoreError, match="compare-and-swap"):
        atomic_ckpt.remote.open("ftp://host/x")


def test_open_names_the_same_root_as_the_cli(
    gs_server: Emulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What open() commits, ``atomic-ckpt latest`` of the same URL prints."""
    url = f"gs://{gs_server.new_bucket()}/run"
    with atomic_ckpt.remote.open(url, storage_options=gs_server.options()).commit(7) as path:
        write_tree(path, 7)
    assert main(["latest", url, "--storage-options", json.dumps(gs_server.options())]) == 0
    assert capsys.readouterr().out.strip() == f"{url}/7"


def test_large_files_through_any_option_form(az_server: Emulator, tmp_path: Path) -> None:
    """A block upload through the account_name/account_key form (its signing covers the
    block requests too)."""
    options = _azure_forms(az_server)["account_name+account_key"]
    rdir = RemoteCheckpointDir(
        f"az://{az_server.new_bucket()}/run",
        storage_options=options,
        staging_dir=tmp_path / "staging",
        part_size=SMALL_PART,
        multipart_threshold=SMALL_PART,
    )
    with rdir.commit(1) as path:
        expected = write_tree(path, 1, big=SMALL_PART + 11)
    assert read_tree(rdir.fetch(1, tmp_path / "got").path) == expected
