"""A real S3 API on loopback: moto's server mode on 127.0.0.1 (a random free port), with
dummy credentials, one fresh bucket per test. Nothing outside the machine is reached."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("s3fs", reason="the s3 extra is not installed: pip install 'atomic_ckpt[s3]'")
pytest.importorskip("moto.server", reason="moto[server] is not installed (the test extra)")

from _remote_support import AWS_ENV, S3, SMALL_PART
from moto.server import ThreadedMotoServer

from atomic_ckpt.remote import RemoteCheckpointDir


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3]:
    """moto's ThreadedMotoServer on 127.0.0.1, for the whole session."""
    saved = {k: os.environ.get(k) for k in AWS_ENV}
    os.environ.update(AWS_ENV)
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
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
