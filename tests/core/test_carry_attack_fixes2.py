"""Fixes for the second attack on issue 32 (a4, a5, a6, the dedup fsync): each test failed
before its fix. A carried file shares storage with a committed one, so nothing the user
does inside the block may write into it, and a refused carry changes nothing."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

import atomic_ckpt._core.l2_syscalls.fs as fs_mod
from atomic_ckpt import CheckpointDir, VerificationError

MODEL = bytes(range(256)) * 256


def _first(ckpts: CheckpointDir) -> None:
    with ckpts.commit(4) as path:
        (path / "model.pt").write_bytes(MODEL)
        (path / "sub").mkdir()
        (path / "sub" / "file.bin").write_bytes(MODEL[:1000])
        (path / "a" / "b" / "c").mkdir(parents=True)
        (path / "a" / "b" / "c" / "file").write_bytes(b"deep")


def _tree(top: Path) -> list[str]:
    return sorted(
        os.path.relpath(os.path.join(d, n), top) for d, ds, fs in os.walk(top) for n in ds + fs
    )


@pytest.mark.parametrize("mode", ["wb", "ab", "w+b"])
def test_a6_writing_over_a_carried_name_never_touches_the_source(tmp_path: Path, mode: str) -> None:
    """carry, then a plain open-for-writing of the same name in the block: the source's
    bytes stay, the user's file wins (the carry is dropped), both checkpoints verify."""
    ckpts = CheckpointDir(tmp_path / "r")
    _first(ckpts)
    with ckpts.begin(5) as commit:
        commit.carry("model.pt", from_=4)
        with open(commit.path / "model.pt", mode) as f:
            f.write(b"new weights")
    assert (ckpts.path_of(4) / "model.pt").read_bytes() == MODEL
    assert (ckpts.path_of(5) / "model.pt").read_bytes() == b"new weights"
    assert os.lstat(ckpts.path_of(4) / "model.pt").st_nlink == 1
    ckpts.verify(4)
    ckpts.verify(5)


def test_a6_torch_save_over_a_carried_name_never_touches_the_source(tmp_path: Path) -> None:
    """torch.save over a carried name (opens it "wb") leaves the source whole."""
    torch = pytest.importorskip("torch")
    ckpts = CheckpointDir(tmp_path / "r")
    _first(ckpts)
    with ckpts.begin(5) as commit:
        commit.carry("model.pt", from_=4)
        torch.save({"w": torch.ones(3)}, commit.path / "model.pt")
    assert (ckpts.path_of(4) / "model.pt").read_bytes() == MODEL
    ckpts.verify(4)
    ckpts.verify(5)
    loaded = torch.load(ckpts.path_of(5) / "model.pt", weights_only=True)
    assert torch.equal(loaded["w"], torch.ones(3))


def test_a6_a_carried_file_is_placed_at_the_publish(tmp_path: Path) -> None:
    """Without a write at its name, the carried file is there once published, shared."""
    ckpts = CheckpointDir(tmp_path / "r")
    _first(ckpts)
    with ckpts.begin(5) as commit:
        how = commit.carry("model.pt", from_=4)
        assert not os.path.lexists(commit.path / "model.pt")  # nothing to write through
    assert (ckpts.path_of(5) / "model.pt").read_bytes() == MODEL
    if how == "hardlink":
        assert os.lstat(ckpts.path_of(5) / "model.pt").st_nlink == 2
    assert [e.path for e in ckpts.get(5).manifest.files] == ["model.pt"]
    ckpts.verify(5)


def test_a6_a_subtree_merges_with_what_the_block_wrote_in_it(tmp_path: Path) -> None:
    """A carried directory merges with the block's files in it; a name both have is the
    block's."""
    ckpts = CheckpointDir(tmp_path / "r")
    _first(ckpts)
    with ckpts.begin(5) as commit:
        commit.carry("a/", from_=4)
        (commit.path / "a" / "b" / "c").mkdir(parents=True)
        (commit.path / "a" / "b" / "c" / "file").write_bytes(b"mine")
        (commit.path / "a" / "extra").write_bytes(b"extra")
    assert (ckpts.path_of(4) / "a/b/c/file").read_bytes() == b"deep"
    assert (ckpts.path_of(5) / "a/b/c/file").read_bytes() == b"mine"
    assert (ckpts.path_of(5) / "a/extra").read_bytes() == b"extra"
    ckpts.verify(4)
    ckpts.verify(5)


def test_a6_carrying_the_same_path_twice_is_refused(tmp_path: Path) -> None:
    """A path (or one inside it) already carried into the commit cannot be carried again."""
    ckpts = CheckpointDir(tmp_path / "r")
    _first(ckpts)
    with ckpts.begin(5) as commit:
        commit.carry("sub/", from_=4)
        with pytest.raises(FileExistsError, match="already carried"):
            commit.carry("sub/file.bin", from_=4)
    ckpts.verify(5)


def test_a4_carry_refuses_a_symlinked_staging_parent(tmp_path: Path) -> None:
    """A staging subdirectory that is a symlink is never followed: the carry raises
    NotADirectoryError and nothing appears where it points."""
    ckpts = CheckpointDir(tmp_path / "r")
    _first(ckpts)
    outside = tmp_path / "outside"
    outside.mkdir()
    with ckpts.begin(5) as commit:
        (commit.path / "sub").symlink_to(outside)
        with pytest.raises(NotADirectoryError, match="symbolic link"):
            commit.carry("sub/file.bin", from_=4)
        assert _tree(commit.path) == ["sub"]
    assert os.listdir(outside) == []
    ckpts.verify(4)


def test_a4_a_parent_made_a_symlink_after_the_carry_stops_the_publish(tmp_path: Path) -> None:
    """A parent the block replaced by a symlink after carrying is refused at the publish:
    nothing is published, nothing written through the link."""
    ckpts = CheckpointDir(tmp_path / "r")
    _first(ckpts)
    outside = tmp_path / "outside"
    outside.mkdir()
    commit = ckpts.begin(5)
    commit.carry("a/b/c/file", from_=4)
    (commit.path / "a").symlink_to(outside)
    with pytest.raises(NotADirectoryError, match="symbolic link"):
        commit.publish()
    assert os.listdir(outside) == []
    assert ckpts.steps() == [4]
    ckpts.verify(4)


def test_a5_a_refused_nested_carry_leaves_no_directories(tmp_path: Path) -> None:
    """A nested carry refused after its source changed leaves the staging dir as it was:
    the published checkpoint has no empty directories the user never made."""
    ckpts = CheckpointDir(tmp_path / "r")
    _first(ckpts)
    with open(ckpts.path_of(4) / "a/b/c/file", "r+b") as f:
        f.write(b"X")
    with ckpts.begin(5) as commit:
        (commit.path / "mine").write_bytes(b"x")
        with pytest.raises(VerificationError):
            commit.carry("a/b/c/file", from_=4)
        assert _tree(commit.path) == ["mine"]
    assert [e.path for e in ckpts.get(5).manifest.files] == ["mine"]


def test_dedup_fsyncs_the_linked_inode_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The inode a dedup link names is fsynced once, whatever the link: a reflink's new
    inode (its shared extents), or a hard link's source inode, whose raised link count a
    directory fsync does not write on every filesystem (ext4 without a journal, ext2):
    a power loss there could leave the count low, and deleting the source would free
    data the new checkpoint names."""
    ckpts = CheckpointDir(tmp_path / "r")
    with ckpts.commit(1) as path:
        (path / "big.bin").write_bytes(MODEL * 8)
        (path / "small.bin").write_bytes(b"changes")
    source = os.lstat(ckpts.path_of(1) / "big.bin")
    fsynced: list[int] = []
    real = fs_mod.fsync_fd

    def spy(fd: int) -> None:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode):
            fsynced.append(st.st_ino)
        real(fd)

    monkeypatch.setattr(fs_mod, "fsync_fd", spy)
    with ckpts.begin(2, dedup=True) as commit:
        (commit.path / "big.bin").write_bytes(MODEL * 8)
        (commit.path / "small.bin").write_bytes(b"changed")
    assert fsynced, "the spy saw no fsync"
    assert set(commit.deduped) == {"big.bin"}
    linked = os.lstat(ckpts.path_of(2) / "big.bin").st_ino
    if commit.deduped["big.bin"] == "hardlink":
        assert linked == source.st_ino
    assert fsynced.count(linked) == 1
    ckpts.verify(2)
