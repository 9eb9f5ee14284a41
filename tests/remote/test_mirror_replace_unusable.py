"""A Mirror whose remote step holds a checkpoint this release must not lose (a newer
release's, or one copied there from another step) has its upload refused, as a remote
commit is; ``replace_unusable=True`` on ``Mirror.commit`` / ``Mirror.mirror`` passes the
knowing choice through to the background upload. Mirror used to offer no such option,
so the refusal (which names it) repeated forever."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest

from atomic_ckpt import CheckpointDir, StepConflictError
from atomic_ckpt.remote import Mirror, RemoteCheckpointDir, _protocol

CASES = pytest.mark.parametrize(
    ("old", "new", "says"),
    [
        (b'"version": 2', b'"version": 3', "newer atomic_ckpt"),
        (b'"step": 5', b'"step": 4', "copied there by hand"),
    ],
    ids=["newer-format", "copied-from-another-step"],
)


def _unusable_remote(tmp_path: Path, old: bytes, new: bytes) -> RemoteCheckpointDir:
    """A memory root whose step 5 manifest is rewritten into one this release must keep."""
    rdir = RemoteCheckpointDir(f"memory://atomic-{uuid.uuid4().hex}", staging_dir=tmp_path / "s")
    with rdir.commit(5) as path:
        (path / "model.bin").write_bytes(b"5" * 100)
    key = _protocol.manifest_key("5")
    got = rdir._store.get(key)
    assert got is not None
    assert old in got[0]
    rdir._store.replace(key, got[0].replace(old, new, 1), got[1])
    return rdir


@CASES
def test_the_upload_is_refused_naming_the_mirror_s_option(
    tmp_path: Path, old: bytes, new: bytes, says: str
) -> None:
    """Without the option the upload fails (raised by close), its error says how to pass
    the option to the Mirror, and the remote's step is untouched."""
    remote = _unusable_remote(tmp_path, old, new)
    before = remote._store.get(_protocol.manifest_key("5"))
    mirror = Mirror(CheckpointDir(tmp_path / "local"), remote, snapshot_dir=tmp_path / "snap")
    with mirror.commit(5) as path:
        (path / "model.bin").write_bytes(b"local")
    with pytest.raises(StepConflictError, match=says) as caught:
        mirror.close()
    notes = "\n".join(getattr(caught.value, "__notes__", []))
    assert "mirror.mirror(5, replace_unusable=True)" in notes
    assert remote._store.get(_protocol.manifest_key("5")) == before


@CASES
def test_commit_replace_unusable_reaches_the_upload(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, old: bytes, new: bytes, says: str
) -> None:
    """``mirror.commit(5, replace_unusable=True)`` replaces the remote step knowingly (logged)."""
    remote = _unusable_remote(tmp_path, old, new)
    local = CheckpointDir(tmp_path / "local")
    with (
        caplog.at_level(logging.WARNING, logger="atomic_ckpt"),
        Mirror(local, remote, snapshot_dir=tmp_path / "snap") as mirror,
        mirror.commit(5, replace_unusable=True) as path,
    ):
        (path / "model.bin").write_bytes(b"local")
    assert [c.step for c in mirror.uploaded] == [5]
    assert says in caplog.text
    remote.verify(5)
    assert remote.fetch(5, tmp_path / "got").path.joinpath("model.bin").read_bytes() == b"local"


@CASES
def test_mirror_replace_unusable_retries_a_refused_upload(
    tmp_path: Path, old: bytes, new: bytes, says: str
) -> None:
    """The remedy the refusal names works: after the refused upload is raised, mirroring
    the same local step again with ``replace_unusable=True`` uploads it."""
    remote = _unusable_remote(tmp_path, old, new)
    local = CheckpointDir(tmp_path / "local")
    mirror = Mirror(local, remote, snapshot_dir=tmp_path / "snap")
    with mirror.commit(5) as path:
        (path / "model.bin").write_bytes(b"local")
    with pytest.raises(StepConflictError, match=says):
        mirror.wait()
    mirror.mirror(5, replace_unusable=True)
    mirror.close()
    assert [c.step for c in mirror.uploaded] == [5]
    remote.verify(5)
