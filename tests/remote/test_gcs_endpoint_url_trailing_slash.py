"""A gs:// endpoint_url written with a trailing slash (``http://host:port/``), as
STORAGE_EMULATOR_HOST and endpoint URLs are often written: attack s15-atk33 on issue 33,
fake-gcs-server. az:// takes its endpoint with a trailing slash."""

from __future__ import annotations

from pathlib import Path

import pytest
from _emulators import Emulator

from atomic_ckpt.remote import NoSuchBucketError, RemoteCheckpointDir


@pytest.mark.xfail(
    strict=True,
    reason="gs:// endpoint_url with a trailing '/' reports an existing bucket as missing",
)
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
