"""The shared-inode rule: nothing the library does writes into a committed file, so a
file deduplicated or carried into another checkpoint (the same inode, by hard link) is
never changed through its other name.

Each path that writes into a committed checkpoint runs with every ``open`` for writing
watched: an open of one of the shared inodes for writing is recorded (and the test
fails), and the other checkpoint's file must hold its bytes afterwards.
"""

from __future__ import annotations

import builtins
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from atomic_ckpt import (
    CheckpointDir,
    VerificationError,
    atomic_write,
    write_bytes_atomic,
)

FILES = {"shard.bin": bytes(range(256)) * 64, "sub/vocab.json": b'{"a": 1}'}
_WRITE = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND


@contextlib.contextmanager
def _no_write_into(inodes: set[int]) -> Iterator[list[str]]:
    """Record every open for writing of a file whose inode is one of ``inodes``."""
    hits: list[str] = []
    real_open, real_builtin = os.open, builtins.open

    def inode(path: Any, dir_fd: int | None = None) -> int | None:
        try:
            return os.stat(path, dir_fd=dir_fd, follow_symlinks=False).st_ino
        except (OSError, TypeError, ValueError):
            return None

    def spy_open(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if flags & _WRITE and inode(path, dir_fd) in inodes:
            hits.append(f"os.open({path!r}, {flags:#o})")
        return real_open(path, flags, mode, dir_fd=dir_fd)

    def spy_builtin(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        writing = isinstance(file, str | os.PathLike) and set(mode) & set("wa+x")
        if writing and inode(file) in inodes:
            hits.append(f"open({file!r}, {mode!r})")
        return real_builtin(file, mode, *args, **kwargs)

    os.open = spy_open  # type: ignore[assignment]
    builtins.open = spy_builtin
    try:
        yield hits
    finally:
        os.open, builtins.open = real_open, real_builtin


def _two(tmp_path: Path) -> tuple[CheckpointDir, set[int]]:
    """Steps 1 and 2, 2's files deduplicated against 1's (hard links: the same inodes)."""
    ckpts = CheckpointDir(tmp_path)
    for step in (1, 2):
        with ckpts.begin(step, dedup=True) as commit:
            for rel, data in FILES.items():
                (commit.path / rel).parent.mkdir(parents=True, exist_ok=True)
                (commit.path / rel).write_bytes(data)
    if set(commit.deduped.values()) != {"hardlink"}:
        pytest.skip(f"the filesystem did not hard-link ({commit.deduped})")
    shared = {os.lstat(ckpts.path_of(1) / rel).st_ino for rel in FILES}
    assert shared == {os.lstat(ckpts.path_of(2) / rel).st_ino for rel in FILES}
    return ckpts, shared


def _unchanged(ckpts: CheckpointDir, step: int) -> None:
    for rel, data in FILES.items():
        assert (ckpts.path_of(step) / rel).read_bytes() == data, f"{step}/{rel} changed"
    ckpts.verify(step)


def test_amend_replacing_a_shared_file_writes_a_new_one(tmp_path: Path) -> None:
    ckpts, shared = _two(tmp_path)
    with _no_write_into(shared) as hits, ckpts.amend(2) as path:
        (path / "shard.bin").write_bytes(b"replaced")
    assert hits == []
    _unchanged(ckpts, 1)
    assert (ckpts.path_of(2) / "shard.bin").read_bytes() == b"replaced"
    ckpts.verify(2)


def test_amend_adding_a_file_links_the_rest_without_writing(tmp_path: Path) -> None:
    ckpts, shared = _two(tmp_path)
    with _no_write_into(shared) as hits, ckpts.amend(2) as path:
        (path / "extra.txt").write_bytes(b"more")
    assert hits == []
    _unchanged(ckpts, 1)
    _unchanged(ckpts, 2)


def test_amend_of_metadata_only_rewrites_the_marker_by_rename(tmp_path: Path) -> None:
    ckpts, shared = _two(tmp_path)
    marker = os.lstat(ckpts.path_of(2) / "checkpoint_complete").st_ino
    with _no_write_into(shared | {marker}) as hits, ckpts.amend(2, metadata={"loss": 1.0}):
        pass
    assert hits == []
    assert ckpts.get(2).manifest.metadata == {"loss": 1.0}
    _unchanged(ckpts, 1)
    _unchanged(ckpts, 2)


@pytest.mark.parametrize("how", ["atomic_write", "write_bytes_atomic"])
def test_an_atomic_write_into_a_checkpoint_replaces_the_name(tmp_path: Path, how: str) -> None:
    """The other checkpoint keeps its bytes; verify() of the one written into reports the
    file that no longer matches its manifest."""
    ckpts, shared = _two(tmp_path)
    target = ckpts.path_of(2) / "shard.bin"
    with _no_write_into(shared) as hits:
        if how == "atomic_write":
            with atomic_write(target) as tmp:
                tmp.write_bytes(b"overwritten")
        else:
            write_bytes_atomic(target, b"overwritten")
    assert hits == []
    _unchanged(ckpts, 1)
    with pytest.raises(VerificationError, match=r"shard\.bin"):
        ckpts.verify(2)


def test_mark_complete_of_a_directory_holding_a_link_writes_only_its_marker(
    tmp_path: Path,
) -> None:
    ckpts, shared = _two(tmp_path)
    hand = ckpts.path_of(3)
    (hand / "sub").mkdir(parents=True)
    for rel in FILES:
        os.link(ckpts.path_of(1) / rel, hand / rel)
    with _no_write_into(shared) as hits:
        ckpts.mark_complete(3)
    assert hits == []
    _unchanged(ckpts, 1)
    _unchanged(ckpts, 3)


def test_clean_and_removals_never_touch_the_other_link(tmp_path: Path) -> None:
    ckpts, shared = _two(tmp_path)
    with _no_write_into(shared) as hits:
        ckpts.clean()
        ckpts.delete(1)
    assert hits == []
    _unchanged(ckpts, 2)
    assert all(os.lstat(ckpts.path_of(2) / rel).st_nlink == 1 for rel in FILES)


@pytest.mark.parametrize("written", [1, 2])
def test_verify_of_either_checkpoint_catches_a_write_in_place(tmp_path: Path, written: int) -> None:
    """A user who writes into a shared file anyway damages both checkpoints, and both
    verify() calls say which file."""
    ckpts, _ = _two(tmp_path)
    with open(ckpts.path_of(written) / "shard.bin", "r+b") as f:
        f.write(b"ZZ")
    for step in (1, 2):
        with pytest.raises(VerificationError, match=r"shard\.bin"):
            ckpts.verify(step)


def test_the_watch_sees_a_write_into_a_shared_inode(tmp_path: Path) -> None:
    """The watch above can fail: an open for writing through the other name is caught."""
    ckpts, shared = _two(tmp_path)
    with _no_write_into(shared) as hits:
        with open(ckpts.path_of(2) / "shard.bin", "r+b"):
            pass
        os.close(os.open(ckpts.path_of(2) / "sub" / "vocab.json", os.O_WRONLY))
    assert len(hits) == 2
