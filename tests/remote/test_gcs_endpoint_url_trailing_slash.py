"""A gs:// endpoint_url written with a trailing slash (``http://host:port/``), as
STORAGE_EMULATOR_HOST and endpoint URLs are often written: attack s15-atk33 on issue 33,
fake-gcs-server. az:// takes its endpoint with a trailing slash."""

from __future__ import annotations

from pathlib import Path

import pytest
from _emulators import Emulator

from atomic_ckpt.remote import NoSuchBucketError, RemoteCheckpointDir


def test_an_endpoint_url_with_a_trailing_slash_reaches_the_bucket(
    gs_server: Emulator, tmp_path: Path
) -> None:
    """The bucket is reached (or the slash refused by name), never called missing."""
    rdir = RemoteCheckpointDir(
        f"gs://{gs_server.new_bucket()}/run",
        storage_options={"endpoint_url": gs_server.endpoint + "/"},
        staging_dir=tmp_path / "staging",
    )
    refused = ""
    try:
        with rdir.commit(1) as path:
            (path / "w.bin").write_bytes(b"w" * 100)
    except NoSuchBucketError as exc:
        pytest.fail(f"an existing bucket reported missing: {exc}")
    except ValueError as exc:  # refusing the form, by name, is fine too
        refused = str(exc)
    if refused:
        assert "endpoint_url" in refused
    else:
        assert rdir.steps() == [1]


def test_storage_emulator_host_with_a_trailing_slash_reaches_the_bucket(
    gs_server: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """STORAGE_EMULATOR_HOST written as http://host:port/ reaches the bucket as well."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gs_server.endpoint + "/")
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    rdir = RemoteCheckpointDir(f"gs://{gs_server.new_bucket()}/run", staging_dir=tmp_path / "s")
    with rdir.commit(1) as path:
        (path / "w.bin").write_bytes(b"w" * 100)
    assert rdir.steps() == [1]


@pytest.mark.parametrize("tail", ["/gcs", "/storage/v1", "/?x=1"])
def test_an_endpoint_url_with_a_path_is_refused_by_name(
    gs_server: Emulator, tmp_path: Path, tail: str
) -> None:
    """A path (or query) after the host is a ValueError naming endpoint_url, before any request."""
    with pytest.raises(ValueError, match=r"endpoint_url .* has a path: .* give it as http://"):
        RemoteCheckpointDir(
            f"gs://{gs_server.new_bucket()}/run",
            storage_options={"endpoint_url": gs_server.endpoint + tail},
            staging_dir=tmp_path / "staging",
        ).steps()
