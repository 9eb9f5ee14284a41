"""A remote ``clean()`` removes only attempts that no checkpoint can reference. A step
whose manifest this release cannot parse (a newer atomic_ckpt's format, or a manifest
copied there by hand from another step) still references its data: clean() used to
count its attempt as unreferenced and delete its objects once the grace period passed,
destroying a checkpoint a newer release wrote. Now every attempt under such a step's
folder is kept (logged); attempts of readable steps are cleaned as before."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest

from atomic_ckpt.remote import RemoteCheckpointDir, _protocol


def _rewrite(rdir: RemoteCheckpointDir, step: int, old: bytes, new: bytes) -> None:
    store = rdir._store
    key = _protocol.manifest_key(f"{step}")
    got = store.get(key)
    assert got is not None
    data, etag = got
    assert old in data
    store.replace(key, data.replace(old, new, 1), etag)


@pytest.mark.parametrize(
    ("old", "new"),
    [(b'"version": 2', b'"version": 3'), (b'"step": 5', b'"step": 4')],
    ids=["newer-format", "copied-from-another-step"],
)
def test_clean_keeps_the_data_of_a_manifest_it_cannot_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, old: bytes, new: bytes
) -> None:
    """Step 5's manifest is made unreadable here; an attempt left by a killed commit of
    step 6 is garbage. ``clean(grace=0)`` removes the garbage, keeps step 5's objects."""
    rdir = RemoteCheckpointDir(f"memory://atomic-{uuid.uuid4().hex}", staging_dir=tmp_path / "s")
    with rdir.commit(5) as path:
        (path / "model.bin").write_bytes(b"5" * 100)
    with rdir.commit(6) as path:
        (path / "model.bin").write_bytes(b"6" * 100)
    store = rdir._store
    stray = "6/" + uuid.uuid4().hex + "/model.bin"  # a killed commit's upload
    store.create(stray, b"stray")
    _rewrite(rdir, 5, old, new)
    before = sorted(k for k in store.find("") if k.startswith("5/"))
    assert len(before) == 2  # its manifest and its model
    with caplog.at_level(logging.WARNING):
        removed = rdir.clean(grace=0)
    assert removed == [store.url_of(stray.rpartition("/")[0] + "/")]
    assert sorted(k for k in store.find("") if k.startswith("5/")) == before
    assert "kept" in caplog.text
    assert rdir.steps() == [6]
