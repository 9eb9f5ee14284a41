"""Dedup at commit time: a written file equal to the previous checkpoint's same path is
replaced by a link to it inside the staging dir, before the marker; each checkpoint whole."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest

from atomic_ckpt import CheckpointDir, CommitStateError
from atomic_ckpt._core.l2_syscalls import share as _share
from atomic_ckpt._core.l2_syscalls.sync import SyncPolicy

SHARD = bytes(range(256)) * 256  # 64 KiB
FILES = {
    "model-00001.safetensors": SHARD,
    "tokenizer/vocab.json": b'{"a": 1}',
    "config.json": b'{"n": 2}',
}


def _save(path: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_bytes(data)


def _ino(path: Path) -> int:
    return os.lstat(path).st_ino


def _entries(ckpts: CheckpointDir, step: int) -> dict[str, tuple[int, str | None]]:
    return {e.path: (e.size, e.checksum) for e in ckpts.get(step).manifest.files}


def test_identical_files_become_links_with_the_same_entries(tmp_path: Path) -> None:
    """Every file equal to step 1's is the same inode (hard link on ext4/tmpfs, or a
    reflink); the changed one is new; the entries are step 1's; Commit.deduped says so."""
    ckpts = CheckpointDir(tmp_path)
    with ckpts.commit(1) as path:
        _save(path, {**FILES, "optimizer.pt": b"moments 1"})
    with ckpts.begin(2, dedup=True) as commit:
        _save(commit.path, {**FILES, "optimizer.pt": b"moments 2"})
    assert set(commit.deduped) == set(FILES)
    assert set(commit.deduped.values()) <= {"reflink", "hardlink"}
    one, two = ckpts.path_of(1), ckpts.path_of(2)
    for rel, how in commit.deduped.items():
        if how == "hardlink":
            assert _ino(two / rel) == _ino(one / rel)
            assert os.lstat(two / rel).st_nlink == 2
    assert _ino(two / "optimizer.pt") != _ino(one / "optimizer.pt")
    for rel in FILES:
        assert _entries(ckpts, 2)[rel] == _entries(ckpts, 1)[rel]
    assert not [n for n in os.listdir(two) if ".tmp-" in n]  # no temporary name left
    ckpts.verify(1)
    ckpts.verify(2)


def test_a_changed_file_is_not_deduped(tmp_path: Path) -> None:
    """Same size, other bytes (another checksum); another size; a new path: all written."""
    ckpts = CheckpointDir(tmp_path)
    with ckpts.commit(1) as path:
        _save(path, FILES)
    changed = {
        "model-00001.safetensors": SHARD[:-1] + b"X",  # same size
        "tokenizer/vocab.json": b'{"a": 10}',  # another size
        "config.json": FILES["config.json"],
        "new.bin": b"new",
    }
    with ckpts.begin(2, dedup=True) as commit:
        _save(commit.path, changed)
    assert set(commit.deduped) == {"config.json"}
    for rel, data in changed.items():
        assert (ckpts.path_of(2) / rel).read_bytes() == data
    assert (ckpts.path_of(1) / "model-00001.safetensors").read_bytes() == SHARD
    ckpts.verify(1)
    ckpts.verify(2)


def test_without_dedup_nothing_is_linked(tmp_path: Path) -> None:
    """The default is off: identical files stay separate inodes."""
    ckpts = CheckpointDir(tmp_path)
    for step in (1, 2):
        with ckpts.begin(step) as commit:
            _save(commit.path, FILES)
    assert commit.deduped == {}
    assert os.lstat(ckpts.path_of(2) / "config.json").st_nlink == 1


@pytest.mark.parametrize("how", ["delete", "prune", "retain"])
def test_deleting_the_previous_checkpoint_afterwards_loses_nothing(
    tmp_path: Path, how: str
) -> None:
    """The deduped checkpoint keeps every byte when its source goes, by any removal."""
    ckpts = CheckpointDir(tmp_path)
    with ckpts.commit(1) as path:
        _save(path, FILES)
    with ckpts.commit(2, dedup=True) as path:
        _save(path, FILES)
    if how == "delete":
        ckpts.delete(1)
    elif how == "prune":
        ckpts.prune(keep_last=1)
    else:
        ckpts.retain(keep_last=1)
    assert ckpts.steps() == [2]
    for rel, data in FILES.items():
        assert (ckpts.path_of(2) / rel).read_bytes() == data
        assert os.lstat(ckpts.path_of(2) / rel).st_nlink == 1
    ckpts.verify(2)


def test_deleting_the_deduped_checkpoint_leaves_the_source_whole(tmp_path: Path) -> None:
    ckpts = CheckpointDir(tmp_path)
    with ckpts.commit(1) as path:
        _save(path, FILES)
    with ckpts.commit(2, dedup=True) as path:
        _save(path, FILES)
    ckpts.delete(2)
    ckpts.verify(1)


def test_a_file_modified_in_place_in_the_previous_checkpoint_is_never_trusted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Step 1's shard rewritten in place (same size) after its commit: its manifest still
    records the bytes step 2 writes, but the file is not the one it describes, so it is
    not linked (else step 2 would hold the damaged bytes); a warning says so."""
    ckpts = CheckpointDir(tmp_path)
    with ckpts.commit(1) as path:
        _save(path, FILES)
    shard = ckpts.path_of(1) / "model-00001.safetensors"
    recorded = {e.path: e for e in ckpts.get(1).manifest.files}["model-00001.safetensors"]
    with open(shard, "r+b") as f:
        f.write(b"DAMAGED")
    st = os.stat(shard)
    if st.st_mtime_ns == recorded.mtime_ns:  # the same clock tick: as one tick later
        os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    with caplog.at_level(logging.WARNING), ckpts.begin(2, dedup=True) as commit:
        _save(commit.path, FILES)
    assert "model-00001.safetensors" not in commit.deduped
    assert set(commit.deduped) == {"tokenizer/vocab.json", "config.json"}
    assert _ino(ckpts.path_of(2) / "model-00001.safetensors") != _ino(shard)
    assert (ckpts.path_of(2) / "model-00001.safetensors").read_bytes() == SHARD
    assert "not the file its manifest describes" in caplog.text
    ckpts.verify(2)


def test_a_touched_previous_file_is_not_trusted_either(tmp_path: Path) -> None:
    """Only the committed identity vouches for a file; dedup never hashes the source."""
    ckpts = CheckpointDir(tmp_path)
    with ckpts.commit(1) as path:
        _save(path, FILES)
    os.utime(ckpts.path_of(1) / "config.json", ns=(1, 1))
    with ckpts.begin(2, dedup=True) as commit:
        _save(commit.path, FILES)
    assert set(commit.deduped) == {"model-00001.safetensors", "tokenizer/vocab.json"}


def test_the_source_is_never_read_and_the_new_files_hashed_once(tmp_path: Path) -> None:
    """Dedup adds no hashing: the files written are hashed once by the publish (as
    without dedup), the previous checkpoint's not at all."""
    import atomic_ckpt._core.l3_formats.tree as tree_mod

    ckpts = CheckpointDir(tmp_path)
    with ckpts.commit(1) as path:
        _save(path, FILES)
    hashed: list[str] = []
    real = tree_mod.checksum_file

    def spy(path: Path, algorithm: str, **kw: object) -> str:
        hashed.append(str(Path(path).relative_to(tmp_path)))
        return real(path, algorithm, **kw)  # type: ignore[arg-type]

    tree_mod.checksum_file = spy  # type: ignore[assignment]
    try:
        with ckpts.begin(2, dedup=True) as commit:
            _save(commit.path, FILES)
    finally:
        tree_mod.checksum_file = real
    assert len(commit.deduped) == len(FILES)
    assert sorted(Path(h).name for h in hashed) == sorted(Path(r).name for r in FILES)
    assert all(h.startswith("2.tmp-") for h in hashed), hashed


def test_dedup_against_a_named_source_and_a_named_commit(tmp_path: Path) -> None:
    """``dedup=`` takes a step or a name; a named commit with True uses the newest step."""
    ckpts = CheckpointDir(tmp_path)
    with ckpts.commit_named("base") as path:
        _save(path, FILES)
    with ckpts.commit(5) as path:
        _save(path, {"config.json": FILES["config.json"]})
    with ckpts.begin(7, dedup="base") as commit:
        _save(commit.path, FILES)
    assert set(commit.deduped) == set(FILES)
    with ckpts.begin_named("interrupted", dedup=True) as named:
        _save(named.path, FILES)
    assert set(named.deduped) == set(FILES)  # against step 7, the newest
    with ckpts.commit_named("other", dedup=5) as path:
        _save(path, FILES)
    assert os.lstat(ckpts.root / "other" / "config.json").st_nlink >= 2
    for name in ("base", "interrupted", "other"):
        for rel, data in FILES.items():
            assert (ckpts.root / name / rel).read_bytes() == data
    ckpts.verify(7)


def test_true_means_the_newest_step_at_or_below_the_commit(tmp_path: Path) -> None:
    """Committing step 3 while 5 exists dedups against 3's predecessor (2), not 5; a
    rewrite of step 2 dedups against its own older save."""
    ckpts = CheckpointDir(tmp_path)
    for step in (2, 5):
        with ckpts.commit(step) as path:
            _save(path, {"config.json": f"step {step}".encode()})
    with ckpts.begin(3, dedup=True) as commit:
        _save(commit.path, {"config.json": b"step 2"})
    assert commit.deduped == {"config.json": commit.deduped["config.json"]}
    with ckpts.begin(2, dedup=True) as rewrite:
        _save(rewrite.path, {"config.json": b"step 2"})
    assert set(rewrite.deduped) == {"config.json"}
    for step in (2, 3, 5):
        ckpts.verify(step)


def test_no_previous_checkpoint_is_fine(tmp_path: Path) -> None:
    ckpts = CheckpointDir(tmp_path)
    with ckpts.begin(1, dedup=True) as commit:
        _save(commit.path, FILES)
    with ckpts.begin(2, dedup=9) as missing:  # a step that does not exist: warned
        _save(missing.path, FILES)
    assert commit.deduped == {}
    assert missing.deduped == {}
    ckpts.verify(2)


def test_bad_options_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="checksum=None"):
        CheckpointDir(tmp_path / "a", checksum=None).begin(1, dedup=True)
    for bad in (-1, 1.5, None):
        with pytest.raises(ValueError, match="dedup must be"):
            CheckpointDir(tmp_path / "b").begin(1, dedup=bad)  # type: ignore[arg-type]
    assert not (tmp_path / "a").exists() or os.listdir(tmp_path / "a") == []


def test_where_nothing_can_be_linked_the_written_files_stay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No reflink and no hard link (another filesystem, a link limit): a copy would save
    nothing, so nothing is replaced; the commit succeeds."""
    ckpts = CheckpointDir(tmp_path)
    with ckpts.commit(1) as path:
        _save(path, FILES)
    asked: list[tuple[str, ...]] = []

    def refuse(*args: object, methods: tuple[str, ...] = (), **kw: object) -> object:
        asked.append(methods)
        raise OSError(errno.EOPNOTSUPP, "none of the links is possible here")

    monkeypatch.setattr(_share, "share_file", refuse)
    with ckpts.begin(2, dedup=True) as commit:
        _save(commit.path, FILES)
    assert asked
    assert all(m == ("reflink", "hardlink") for m in asked)  # never "copy"
    assert commit.deduped == {}
    assert os.lstat(ckpts.path_of(2) / "config.json").st_nlink == 1
    ckpts.verify(2)


def test_carried_files_are_left_as_carried(tmp_path: Path) -> None:
    ckpts = CheckpointDir(tmp_path)
    with ckpts.commit(1) as path:
        _save(path, FILES)
    with ckpts.begin(2, dedup=True) as commit:
        commit.carry("tokenizer/", from_=1)
        _save(commit.path, {"config.json": FILES["config.json"]})
    assert set(commit.deduped) == {"config.json"}
    ckpts.verify(2)


def test_a_joined_block_may_turn_dedup_on(tmp_path: Path) -> None:
    """``commit(step, join=True, dedup=...)`` sets the option of the commit it joins; a
    contradicting one is a ValueError that aborts the commit, like any failed join."""
    ckpts = CheckpointDir(tmp_path)
    with ckpts.commit(1) as path:
        _save(path, FILES)
    with ckpts.begin(3) as commit, ckpts.commit(3, join=True, dedup=True) as path:
        _save(path, FILES)
    assert set(commit.deduped) == set(FILES)
    outer = ckpts.begin(4, dedup=True)
    with pytest.raises(ValueError, match="cannot change"), ckpts.commit(4, join=True, dedup=1):
        pass
    with pytest.raises(CommitStateError):
        outer.publish()
    assert ckpts.steps() == [1, 3]


class _DieAtMarker(SyncPolicy):
    """Kills the process where the marker is written: after the dedup links were made."""

    def marker(self, directory: Path, data: bytes, *, tmp: Path | None) -> None:
        os._exit(7)


def test_a_crash_after_the_links_leaves_the_source_whole_and_clean_removes_the_rest(
    tmp_path: Path,
) -> None:
    """A process killed inside the publish (links made, no marker yet): step 1 is intact,
    no step 2 exists, and clean() removes the staging dir without touching step 1's
    files (their link count back to 1)."""
    ckpts = CheckpointDir(tmp_path)
    with ckpts.commit(1) as path:
        _save(path, FILES)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child dies inside the publish
        try:
            child = CheckpointDir(tmp_path, sync=_DieAtMarker())
            with child.commit(2, dedup=True) as path:
                _save(path, FILES)
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 7  # it died where meant, links made
    staged = [n for n in os.listdir(tmp_path) if n.startswith("2.tmp-") and "lock" not in n]
    assert len(staged) == 1
    assert os.lstat(tmp_path / staged[0] / "config.json").st_nlink == 2  # a dedup link
    assert ckpts.steps() == [1]
    removed = ckpts.clean()
    assert any(p.name == staged[0] for p in removed)
    for rel, data in FILES.items():
        assert (ckpts.path_of(1) / rel).read_bytes() == data
        assert os.lstat(ckpts.path_of(1) / rel).st_nlink == 1
    ckpts.verify(1)
