"""A remote commit of a step whose manifest holds a checkpoint this release must not lose
is refused before anything is uploaded, as a local commit is: one a newer atomic_ckpt
wrote (a newer manifest format) or one copied there by hand from another step.
``replace_unusable=True`` replaces it knowingly (logged). It used to be replaced
silently, losing the newer release's checkpoint."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest

from atomic_ckpt import StepConflictError
from atomic_ckpt.remote import RemoteCheckpointDir, _protocol

CASES = pytest.mark.parametrize(
    ("old", "new", "says"),
    [
        (b'"version": 2', b'"version": 3', "newer atomic_ckpt"),
        (b'"step": 5', b'"step": 4', "copied there by hand"),
    ],
    ids=["newer-format", "copied-from-another-step"],
)


def _root(tmp_path: Path) -> RemoteCheckpointDir:
    rdir = RemoteCheckpointDir(f"memory://atomic-{uuid.uuid4().hex}", staging_dir=tmp_path / "s")
    with rdir.commit(5) as path:
        (path / "model.bin").write_bytes(b"5" * 100)
    return rdir


def _rewrite(rdir: RemoteCheckpointDir, old: bytes, new: bytes) -> bytes:
    key = _protocol.manifest_key("5")
    got = rdir._store.get(key)
    assert got is not None
    assert old in got[0]
    data = got[0].replace(old, new, 1)
    rdir._store.replace(key, data, got[1])
    return data


@CASES
def test_a_commit_over_it_is_refused_and_keeps_it(
    tmp_path: Path, old: bytes, new: bytes, says: str
) -> None:
    rdir = _root(tmp_path)
    data = _rewrite(rdir, old, new)
    before = sorted(rdir._store.find(""))
    with pytest.raises(StepConflictError, match=says) as caught, rdir.commit(5) as path:
        (path / "model.bin").write_bytes(b"new")
    assert "replace_unusable=True" in str(caught.value)
    assert sorted(rdir._store.find("")) == before  # nothing uploaded, nothing replaced
    got = rdir._store.get(_protocol.manifest_key("5"))
    assert got is not None
    assert got[0] == data
    with pytest.raises(StepConflictError, match=says):
        rdir.begin(5)


@CASES
def test_replace_unusable_replaces_it_knowingly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, old: bytes, new: bytes, says: str
) -> None:
    rdir = _root(tmp_path)
    _rewrite(rdir, old, new)
    with (
        caplog.at_level(logging.WARNING, logger="atomic_ckpt"),
        rdir.commit(5, replace_unusable=True) as path,
    ):
        (path / "model.bin").write_bytes(b"new")
    assert rdir.steps() == [5]
    assert says in caplog.text
    rdir.verify(5)


def test_the_step_s_own_checkpoint_is_replaced_as_before(tmp_path: Path) -> None:
    """The counterpart: a readable manifest of this step is what a commit replaces."""
    rdir = _root(tmp_path)
    with rdir.commit(5) as path:
        (path / "model.bin").write_bytes(b"again")
    assert rdir.steps() == [5]
    rdir.verify(5)


@CASES
def test_upload_over_it_is_refused_unless_replace_unusable(
    tmp_path: Path, old: bytes, new: bytes, says: str
) -> None:
    """``upload(step, directory)`` refused such a step naming ``replace_unusable=True``,
    an option it did not take: it takes it now, as ``begin`` and ``commit`` do."""
    rdir = _root(tmp_path)
    _rewrite(rdir, old, new)
    local = tmp_path / "local"
    local.mkdir()
    (local / "model.bin").write_bytes(b"local")
    with pytest.raises(StepConflictError, match=says):
        rdir.upload(5, local)
    rdir.upload(5, local, replace_unusable=True)
    assert rdir.steps() == [5]
    rdir.verify(5)
