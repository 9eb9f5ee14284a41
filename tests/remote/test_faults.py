"""Injected request failures on a real S3 API (moto over HTTP), through botocore's
``before-send`` hook on s3fs's client: a 500, a dropped connection, a timeout whose
request did land (ambiguous), persistent failures. Each gives a clear error or a
successful retry, never a reported broken step, and each test asserts its fault fired."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _remote_support import S3, SMALL_PART, Fault, read_tree, write_tree

from atomic_ckpt.remote import RemoteCheckpointDir


@pytest.fixture
def open_rdir(s3_server: S3, s3_url: str, tmp_path: Path) -> Callable[..., RemoteCheckpointDir]:
    """A RemoteCheckpointDir with few, fast retries (botocore's standard mode, 2 attempts;
    s3fs's own retry loop off)."""

    def make(**extra: Any) -> RemoteCheckpointDir:
        options = s3_server.options(
            config_kwargs={"retries": {"max_attempts": 2, "mode": "standard"}}, **extra
        )
        rdir = RemoteCheckpointDir(
            s3_url,
            storage_options=options,
            staging_dir=tmp_path / "staging",
            part_size=SMALL_PART,
            multipart_threshold=SMALL_PART,
        )
        rdir.fs.retries = 1  # no second loop of s3fs's own (an attribute, not an option)
        return rdir

    return make


def _commit(rdir: RemoteCheckpointDir, step: int, seed: int) -> dict[str, bytes]:
    with rdir.commit(step) as path:
        return write_tree(path, seed, big=SMALL_PART + 99)


def _fetch(rdir: RemoteCheckpointDir, step: int, tmp: Path) -> dict[str, bytes]:
    return read_tree(rdir.fetch(step, tmp / f"fetched-{step}-{len(list(tmp.iterdir()))}").path)


@pytest.mark.parametrize(
    ("operation", "what", "match"),
    [
        ("PutObject", "500", "/model.bin"),
        ("UploadPart", "500", "partNumber=2"),
        ("CompleteMultipartUpload", "drop", ""),
        ("ListObjectsV2", "timeout", ""),
        ("PutObject", "drop", "checkpoint_complete"),
        ("PutObject", "500", "checkpoint_complete"),
    ],
    ids=[
        "500-file",
        "500-part",
        "drop-complete-mpu",
        "timeout-listing",
        "drop-manifest",
        "500-manifest",
    ],
)
def test_one_failure_is_retried(
    open_rdir: Callable[..., RemoteCheckpointDir],
    tmp_path: Path,
    operation: str,
    what: str,
    match: str,
) -> None:
    """One failed request (a 500, a dropped connection, a timeout) is retried and the
    commit succeeds, bit-exact."""
    rdir = open_rdir()
    fault = Fault(operation, what, match)
    fault.install(rdir)
    expected = _commit(rdir, 1, 1)
    assert fault.fired == 1
    assert rdir.steps() == [1]
    assert _fetch(rdir, 1, tmp_path) == expected


def test_manifest_write_landed_but_response_lost_is_success(
    open_rdir: Callable[..., RemoteCheckpointDir], tmp_path: Path
) -> None:
    """The manifest write reaches the store but its response times out: the retry meets
    412 (the key exists), finds its own manifest there, and the commit succeeds."""
    rdir = open_rdir()
    fault = Fault("PutObject", "timeout-after-send", "checkpoint_complete")
    fault.install(rdir)
    expected = _commit(rdir, 1, 1)
    assert fault.fired == 1
    assert fault.seen == [200, 412], "the write landed, and the retry was refused"
    assert rdir.steps() == [1]
    assert _fetch(rdir, 1, tmp_path) == expected


def test_replace_landed_but_response_lost_is_success(
    open_rdir: Callable[..., RemoteCheckpointDir], tmp_path: Path
) -> None:
    """The same for a replace (If-Match): the retry's 412 hides a write of our own."""
    rdir = open_rdir()
    _commit(rdir, 1, 1)
    fault = Fault("PutObject", "timeout-after-send", "checkpoint_complete")
    fault.install(rdir)
    expected = _commit(rdir, 1, 2)
    assert fault.fired == 1
    assert fault.seen == [200, 412]
    assert _fetch(rdir, 1, tmp_path) == expected


@pytest.mark.parametrize(
    "case",
    [
        ("UploadPart", "500", "", "InternalError|injected|Internal"),
        ("PutObject", "drop", "/meta.json", "Connection was closed"),
        ("ListObjectsV2", "500", "", "InternalError|injected|Internal"),
        ("PutObject", "timeout", "checkpoint_complete", "Read timeout"),
    ],
    ids=["500-every-part", "dropped-connection-file", "500-listing", "timeout-manifest"],
)
def test_persistent_failure_is_a_clear_error(
    open_rdir: Callable[..., RemoteCheckpointDir], tmp_path: Path, case: tuple[str, ...]
) -> None:
    """A request that keeps failing makes the commit raise (saying what failed); the
    step is not reported, the previous checkpoint is intact, clean() removes the rest."""
    operation, what, match, message = case
    rdir = open_rdir()
    before = _commit(rdir, 1, 1)
    fault = Fault(operation, what, match, times=None)
    fault.install(rdir)
    with pytest.raises(OSError, match=message):
        _commit(rdir, 2, 2)
    assert fault.fired >= 2, "the failure was retried before it was raised"
    clean = open_rdir()  # a fresh client, without the fault
    assert clean.steps() == [1]
    assert _fetch(clean, 1, tmp_path) == before
    clean.clean(grace=0)
    assert [e.status for e in clean.entries()] == ["complete"]
    assert clean._store.live_uploads("") == {}
