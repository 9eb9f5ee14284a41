"""CheckpointDir.sync_files and list_tree: what a rank of a multi-rank commit flushes, and what
the coordinator checks the ranks' declarations against (single process, no ranks)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from atomic_ckpt import CheckpointDir
from atomic_ckpt._core.l2_syscalls import fs as _fs


def tree(top: Path) -> Path:
    top.mkdir()
    (top / "a.bin").write_bytes(b"x" * 10)
    (top / "sub").mkdir()
    (top / "sub" / "b.bin").write_bytes(b"y" * 3)
    os.symlink("/", top / "link")
    return top


def test_sync_files_fsyncs_and_hashes_exactly_the_named_entries(
    ckpts: CheckpointDir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the named entries are fsynced (once each), files hashed, a link recorded only."""
    top = tree(tmp_path / "t")
    synced: list[str] = []
    real_file, real_dir = _fs.fsync_file, _fs.fsync_dir
    monkeypatch.setattr(_fs, "fsync_file", lambda p: (synced.append(str(p)), real_file(p)))
    monkeypatch.setattr(_fs, "fsync_dir", lambda p: (synced.append(str(p)), real_dir(p)))
    entries = ckpts.sync_files(top, ["sub/b.bin", "sub", "link"])
    assert sorted(synced) == [str(top / "sub"), str(top / "sub" / "b.bin")]
    assert [(e.path, e.type, e.size) for e in entries] == [
        ("link", "symlink", 0),
        ("sub", "dir", 0),
        ("sub/b.bin", "file", 3),
    ]
    assert entries[2].checksum == ckpts.checksum_file(top / "sub" / "b.bin")
    assert ckpts.sync_files(top, ["a.bin"], hash=False)[0].checksum is None


@pytest.mark.parametrize("bad", ["../t/a.bin", "link/etc", "/etc/passwd", "sub/../a.bin", ""])
def test_sync_files_refuses_paths_outside_the_directory(
    ckpts: CheckpointDir, tmp_path: Path, bad: str
) -> None:
    """A path that is absolute, climbs with '..' or goes through a symlink is refused."""
    top = tree(tmp_path / "t")
    with pytest.raises(ValueError, match="is not an entry below"):
        ckpts.sync_files(top, [bad])


def test_list_tree_lists_names_and_sizes_without_the_marker(
    ckpts: CheckpointDir, tmp_path: Path
) -> None:
    """list_tree: every entry with its type and size, sorted, the marker left out."""
    top = tree(tmp_path / "t")
    (top / "checkpoint_complete").write_text("{}")
    listed = [(e.path, e.type, e.size) for e in ckpts.list_tree(top)]
    assert listed == [
        ("a.bin", "file", 10),
        ("link", "symlink", 0),
        ("sub", "dir", 0),
        ("sub/b.bin", "file", 3),
    ]
