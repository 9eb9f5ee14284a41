"""The marker's name in a remote root is the marker's only. A remote commit whose save
wrote a directory of that name is refused (the upload left it out, silently). And a
remote manifest that records an entry under the marker's own name (never written by
an upload, which leaves the marker out: a hand-edited or foreign manifest) is refused by
``fetch`` and ``verify`` before anything is downloaded, with a VerificationError naming
it, instead of a bare IsADirectoryError from writing the marker over a directory it made
(a file entry of that name is refused earlier: no object of the attempt holds it)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from atomic_ckpt import MARKER, FileEntry, Manifest, MarkerIsDirectoryError, VerificationError
from atomic_ckpt.remote import RemoteCheckpointDir, _protocol


def test_a_manifest_recording_a_directory_under_the_marker_name_is_refused(
    tmp_path: Path,
) -> None:
    """A directory entry needs no object, so nothing else stops it before the download."""
    rdir = RemoteCheckpointDir(f"memory://atomic-{uuid.uuid4().hex}", staging_dir=tmp_path / "s")
    with rdir.commit(5) as path:
        (path / "model.bin").write_bytes(b"5" * 100)
    key = _protocol.manifest_key("5")
    got = rdir._store.get(key)
    assert got is not None
    manifest = Manifest.from_bytes(got[0])
    extra = FileEntry(MARKER, type="dir")
    edited = Manifest(
        step=5,
        files=(*manifest.files, extra),
        created=manifest.created,
        library_version=manifest.library_version,
        checksum=manifest.checksum,
        metadata=manifest.metadata,
    )
    rdir._store.replace(key, edited.to_bytes(), got[1])
    with pytest.raises(VerificationError, match="marker"):
        rdir.fetch(5, tmp_path / "got")
    assert not (tmp_path / "got").exists()
    with pytest.raises(VerificationError, match="marker"):
        rdir.verify(5)


def test_a_remote_commit_whose_save_wrote_a_marker_named_directory_is_refused(
    tmp_path: Path,
) -> None:
    """The upload left that directory out, silently (its name is skipped as the marker's):
    now the commit is refused, as a local one is, and nothing is uploaded."""
    rdir = RemoteCheckpointDir(f"memory://atomic-{uuid.uuid4().hex}", staging_dir=tmp_path / "s")
    commit = rdir.begin(5)
    (commit.path / "model.bin").write_bytes(b"5")
    (commit.path / MARKER).mkdir()
    (commit.path / MARKER / "notes.txt").write_bytes(b"user data")
    with pytest.raises(MarkerIsDirectoryError, match="reserved"):
        commit.publish()
    commit.abort()
    assert rdir.steps() == []
    assert list(rdir._store.find("")) == []
