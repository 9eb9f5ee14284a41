"""Carrying committed files into a new commit: each checkpoint whole, nothing written twice."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from atomic_ckpt import CheckpointDir, VerificationError
from atomic_ckpt._core.l2_syscalls import share as _share

FROZEN = bytes(range(256)) * 64
TOKENIZER = {"tokenizer/vocab.json": b'{"a": 1}', "tokenizer/sub/merges.txt": b"a b\n"}


def _first(ckpts: CheckpointDir, step: int = 1) -> None:
    with ckpts.commit(step) as path:
        (path / "frozen.bin").write_bytes(FROZEN)
        for rel, data in TOKENIZER.items():
            (path / rel).parent.mkdir(parents=True, exist_ok=True)
            (path / rel).write_bytes(data)
        (path / "trainable.bin").write_bytes(b"old weights")


def _ino(path: Path) -> int:
    return os.lstat(path).st_ino


def test_carry_from_a_step_shares_the_file_and_reuses_its_entry(tmp_path: Path) -> None:
    """A carried file is the source's inode (here a hard link), listed with its entry."""
    ckpts = CheckpointDir(tmp_path)
    _first(ckpts)
    with ckpts.begin(2) as commit:
        how = commit.carry("frozen.bin", from_=1)
        (commit.path / "trainable.bin").write_bytes(b"new weights")
    assert how in ("reflink", "hardlink", "copy")
    if how == "hardlink":
        assert _ino(ckpts.path_of(2) / "frozen.bin") == _ino(ckpts.path_of(1) / "frozen.bin")
    entry = {e.path: e for e in ckpts.get(2).manifest.files}["frozen.bin"]
    source = {e.path: e for e in ckpts.get(1).manifest.files}["frozen.bin"]
    assert (entry.size, entry.checksum) == (source.size, source.checksum)
    ckpts.verify(2)
    ckpts.verify(1)


def test_carry_on_ext4_is_a_hard_link(tmp_path: Path) -> None:
    """ext4 has no reflink: the carry says it made a hard link."""
    with open("/proc/mounts") as f:
        mounts = [line.split() for line in f]
    best = max((m for m in mounts if str(tmp_path).startswith(m[1])), key=lambda m: len(m[1]))
    if best[2] != "ext4":
        pytest.skip(f"{tmp_path} is on {best[2]}, not ext4")
    ckpts = CheckpointDir(tmp_path)
    _first(ckpts)
    with ckpts.begin(2) as commit:
        assert commit.carry("frozen.bin", from_=1) == "hardlink"


def test_carry_from_a_named_checkpoint(tmp_path: Path) -> None:
    """``from_`` may name a named checkpoint; the carrier is whole on its own."""
    ckpts = CheckpointDir(tmp_path)
    with ckpts.commit_named("base") as path:
        (path / "frozen.bin").write_bytes(FROZEN)
    with ckpts.begin(3) as commit:
        commit.carry("frozen.bin", from_="base")
    ckpts.delete("base")
    assert (ckpts.path_of(3) / "frozen.bin").read_bytes() == FROZEN
    ckpts.verify(3)


def test_carry_a_whole_subtree(tmp_path: Path) -> None:
    """``carry("tokenizer/")`` brings every file, directory and link below it."""
    ckpts = CheckpointDir(tmp_path)
    _first(ckpts)
    with ckpts.begin(2) as commit:
        commit.carry("tokenizer/", from_=1)
    for rel, data in TOKENIZER.items():
        assert (ckpts.path_of(2) / rel).read_bytes() == data
    paths = [e.path for e in ckpts.get(2).manifest.files]
    assert paths == [
        "tokenizer",
        "tokenizer/sub",
        "tokenizer/sub/merges.txt",
        "tokenizer/vocab.json",
    ]
    ckpts.verify(2)


def test_commit_and_commit_named_take_carry(tmp_path: Path) -> None:
    """``commit(step, carry={...})`` and ``commit_named(name, carry=...)`` carry first."""
    ckpts = CheckpointDir(tmp_path)
    _first(ckpts)
    with ckpts.commit(2, carry={"frozen.bin": 1, "tokenizer": "1"}) as path:
        assert not (path / "frozen.bin").exists()  # placed at the publish
        (path / "trainable.bin").write_bytes(b"new")
    assert (ckpts.path_of(2) / "frozen.bin").read_bytes() == FROZEN
    with ckpts.commit_named("interrupted", carry={"tokenizer/vocab.json": 2}):
        pass
    assert (ckpts.root / "interrupted" / "tokenizer/vocab.json").exists()
    ckpts.verify(2)
    assert [e.path for e in ckpts.get_named("interrupted").manifest.files] == [
        "tokenizer",
        "tokenizer/vocab.json",
    ]


def test_a_source_changed_in_place_is_refused(tmp_path: Path) -> None:
    """A committed file rewritten in place (same size) is never carried; nothing stays."""
    ckpts = CheckpointDir(tmp_path)
    _first(ckpts)
    with open(ckpts.path_of(1) / "frozen.bin", "r+b") as f:
        f.write(b"X")
    with ckpts.begin(2) as commit:
        with pytest.raises(VerificationError, match="checksum differs"):
            commit.carry("frozen.bin", from_=1)
        assert not (commit.path / "frozen.bin").exists()
        (commit.path / "trainable.bin").write_bytes(b"new")
    assert [e.path for e in ckpts.get(2).manifest.files] == ["trainable.bin"]


def test_a_touched_source_with_the_same_bytes_is_verified_then_carried(tmp_path: Path) -> None:
    """A file whose identity changed but whose bytes still match is hashed once, then carried."""
    ckpts = CheckpointDir(tmp_path)
    _first(ckpts)
    os.utime(ckpts.path_of(1) / "frozen.bin", ns=(1, 1))
    calls: list[Path] = []
    import atomic_ckpt._core.l4_protocol.carry as carry_mod

    real = carry_mod.checksum_file

    def spy(path: Path, algorithm: str) -> str:
        calls.append(Path(path))
        return real(path, algorithm)

    carry_mod.checksum_file = spy  # type: ignore[assignment]
    try:
        with ckpts.begin(2) as commit:
            commit.carry("frozen.bin", from_=1)
            waiting = list(commit._pending[0].waiting.values())
    finally:
        carry_mod.checksum_file = real
    assert [p.name for p in calls] == waiting  # the carried file, once
    ckpts.verify(2)


def test_an_unchanged_source_is_not_hashed_again(tmp_path: Path) -> None:
    """The committed identity vouches for the entry: neither carry nor publish reads it."""
    ckpts = CheckpointDir(tmp_path)
    _first(ckpts)
    # Committed well after the file was written (else it is racily clean: hashed).
    marker = tmp_path / "1" / "checkpoint_complete"
    later = os.stat(marker).st_mtime_ns + 10 * 10**9
    os.utime(marker, ns=(later, later))
    import atomic_ckpt._core.l3_formats.tree as tree_mod
    import atomic_ckpt._core.l4_protocol.carry as carry_mod

    hashed: list[str] = []
    real_tree, real_carry = tree_mod.checksum_file, carry_mod.checksum_file

    def spy(path: Path, algorithm: str, **kw: object) -> str:
        hashed.append(Path(path).name)
        return real_tree(path, algorithm, **kw)  # type: ignore[arg-type]

    tree_mod.checksum_file = carry_mod.checksum_file = spy  # type: ignore[assignment]
    try:
        with ckpts.begin(2) as commit:
            commit.carry("frozen.bin", from_=1)
            (commit.path / "trainable.bin").write_bytes(b"new")
    finally:
        tree_mod.checksum_file, carry_mod.checksum_file = real_tree, real_carry
    assert hashed == ["trainable.bin"]


def test_a_carried_file_cannot_be_written_in_place_during_the_block(tmp_path: Path) -> None:
    """A carried file is not at its name until the publish: opening it in place fails,
    and the source keeps its bytes."""
    ckpts = CheckpointDir(tmp_path)
    _first(ckpts)
    with ckpts.begin(2) as commit:
        commit.carry("frozen.bin", from_=1)
        with pytest.raises(FileNotFoundError):
            (commit.path / "frozen.bin").open("r+b").close()
    ckpts.verify(1)
    ckpts.verify(2)


def test_a_write_into_the_private_carry_area_stops_the_publish(tmp_path: Path) -> None:
    """Code that reaches into the private area and writes a carried file in place is
    refused at publish (the backstop), and verify() of the source reports the damage."""
    ckpts = CheckpointDir(tmp_path)
    _first(ckpts)
    commit = ckpts.begin(2)
    if commit.carry("frozen.bin", from_=1) != "hardlink":
        commit.abort()
        pytest.skip("the filesystem did not hard-link")
    (waiting,) = commit._pending[0].waiting.values()
    with open(commit.path / waiting, "r+b") as f:
        f.write(b"XY")
    with pytest.raises(VerificationError, match="written in place"):
        commit.publish()
    assert ckpts.steps() == [1]
    with pytest.raises(VerificationError):
        ckpts.verify(1)


def test_a_carried_name_the_block_writes_anew_keeps_the_new_bytes(tmp_path: Path) -> None:
    """A file the block writes at a carried name wins: it is hashed like any other, the
    carried one dropped, the source untouched."""
    ckpts = CheckpointDir(tmp_path)
    _first(ckpts)
    with ckpts.begin(2) as commit:
        commit.carry("frozen.bin", from_=1)
        (commit.path / "frozen.bin").write_bytes(b"fresh")
    assert (ckpts.path_of(1) / "frozen.bin").read_bytes() == FROZEN
    assert (ckpts.path_of(2) / "frozen.bin").read_bytes() == b"fresh"
    ckpts.verify(2)
    ckpts.verify(1)


def test_verify_of_either_checkpoint_catches_a_write_into_the_shared_inode(
    tmp_path: Path,
) -> None:
    """A user who writes in place into a carried (hard-linked) file damages both: both
    checkpoints' verify() say so."""
    ckpts = CheckpointDir(tmp_path)
    _first(ckpts)
    with ckpts.begin(2) as commit:
        how = commit.carry("frozen.bin", from_=1)
    if how != "hardlink":
        pytest.skip("the filesystem did not hard-link")
    with open(ckpts.path_of(2) / "frozen.bin", "r+b") as f:
        f.write(b"Z")
    for step in (1, 2):
        with pytest.raises(VerificationError, match=r"frozen\.bin"):
            ckpts.verify(step)


@pytest.mark.parametrize("how", ["delete", "prune", "retain"])
def test_removing_the_source_leaves_the_carrier_whole(tmp_path: Path, how: str) -> None:
    """delete, prune and retain of the source never touch the carrier's files."""
    ckpts = CheckpointDir(tmp_path)
    _first(ckpts)
    with ckpts.commit(2, carry={"frozen.bin": 1, "tokenizer/": 1}) as path:
        (path / "trainable.bin").write_bytes(b"new")
    if how == "delete":
        ckpts.delete(1)
    elif how == "prune":
        ckpts.prune(keep_last=1)
    else:
        ckpts.retain(keep_last=1)
    assert ckpts.steps() == [2]
    assert (ckpts.path_of(2) / "frozen.bin").read_bytes() == FROZEN
    assert os.lstat(ckpts.path_of(2) / "frozen.bin").st_nlink == 1
    ckpts.verify(2)


def test_removing_the_carrier_leaves_the_source_whole(tmp_path: Path) -> None:
    """Deleting the checkpoint that carried a file leaves its source intact."""
    ckpts = CheckpointDir(tmp_path)
    _first(ckpts)
    with ckpts.commit(2, carry={"frozen.bin": 1}):
        pass
    ckpts.delete(2)
    ckpts.verify(1)


def test_clean_never_removes_a_carried_file(tmp_path: Path) -> None:
    """clean() leaves both checkpoints and the shared files alone."""
    ckpts = CheckpointDir(tmp_path)
    _first(ckpts)
    with ckpts.commit(2, carry={"frozen.bin": 1}):
        pass
    ckpts.clean()
    assert ckpts.steps() == [1, 2]
    ckpts.verify(1)
    ckpts.verify(2)


def test_carry_refuses_a_path_already_in_staging_or_missing(tmp_path: Path) -> None:
    """A path already written, or one the source does not have, is an error that says so."""
    ckpts = CheckpointDir(tmp_path)
    _first(ckpts)
    with ckpts.begin(2) as commit:
        (commit.path / "frozen.bin").write_bytes(b"mine")
        with pytest.raises(FileExistsError):
            commit.carry("frozen.bin", from_=1)
        with pytest.raises(FileNotFoundError, match=r"nothing\.bin"):
            commit.carry("nothing.bin", from_=1)
        with pytest.raises(ValueError, match="inside"):
            commit.carry("../x", from_=1)


def test_a_source_on_another_algorithm_is_hashed_with_the_new_one(tmp_path: Path) -> None:
    """A carried file from a crc32 checkpoint into an xxh3 root gets an xxh3 entry."""
    _first(CheckpointDir(tmp_path, checksum="crc32"))
    ckpts = CheckpointDir(tmp_path)
    with ckpts.begin(2) as commit:
        commit.carry("frozen.bin", from_=1)
    ckpts.verify(2)
    assert ckpts.get(2).manifest.checksum == ckpts.checksum


def test_share_file_falls_back_in_order(tmp_path: Path) -> None:
    """With only a copy allowed, the new file is a separate inode with the same bytes."""
    (tmp_path / "a").write_bytes(FROZEN)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        how, st = _share.share_file(fd, "a", tmp_path / "b", methods=("copy",))
    finally:
        os.close(fd)
    assert how == "copy"
    assert (tmp_path / "b").read_bytes() == FROZEN
    assert _ino(tmp_path / "b") != st.st_ino


def test_save_state_over_a_carried_file_never_writes_into_the_source(tmp_path: Path) -> None:
    """write_state replaces each of its files by a new one: a carried link at its name is
    unlinked, never written through into the checkpoint it came from."""
    torch = pytest.importorskip("torch")
    from atomic_ckpt.torch import MODEL_FILE, STATE_FILE, save_state, write_state

    ckpts = CheckpointDir(tmp_path)
    model = torch.nn.Linear(4, 4)
    save_state(ckpts, 1, model=model)
    before = (ckpts.path_of(1) / MODEL_FILE).read_bytes()
    with torch.no_grad():
        model.weight.add_(1.0)
    with ckpts.begin(2) as commit:
        commit.carry(MODEL_FILE, from_=1)
        commit.carry(STATE_FILE, from_=1)
        write_state(commit.path, step=2, model=model)
    assert (ckpts.path_of(1) / MODEL_FILE).read_bytes() == before
    ckpts.verify(1)
    ckpts.verify(2)
