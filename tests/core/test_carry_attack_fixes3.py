"""Fixes for the third attack on issue 32: each test failed before its fix."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from atomic_ckpt import CheckpointDir
from atomic_ckpt._core.l1_names.names import MARKER

MODEL = bytes(range(256)) * 256


def _first(ckpts: CheckpointDir) -> None:
    with ckpts.commit(1) as path:
        (path / "model.pt").write_bytes(MODEL)
        (path / "tok").mkdir()
        (path / "tok" / "vocab.json").write_bytes(b"{}")
        (path / "tok" / "merges.txt").write_bytes(b"a b")


def test_a_carry_waits_without_making_or_removing_a_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Carried files wait at private names in the staging dir's top level: a carrying
    commit makes no directory but the carried subtree's own and removes none (an rmdir
    frees a block, a synchronous discard on an ext4 without a journal mounted with
    ``discard``: 3-20 ms of a save that writes little)."""
    ckpts = CheckpointDir(tmp_path / "r")
    _first(ckpts)
    removed: list[str] = []
    made: list[str] = []
    real_rmdir, real_mkdir = os.rmdir, os.mkdir

    def rmdir(path: object, *args: object, **kwargs: object) -> None:
        removed.append(os.fsdecode(path))  # type: ignore[arg-type]
        real_rmdir(path, *args, **kwargs)  # type: ignore[arg-type]

    def mkdir(path: object, *args: object, **kwargs: object) -> None:
        real_mkdir(path, *args, **kwargs)  # type: ignore[arg-type]
        made.append(os.fsdecode(path))  # type: ignore[arg-type]

    with ckpts.begin(2) as commit:
        (commit.path / "new.bin").write_bytes(b"new")
        monkeypatch.setattr(os, "rmdir", rmdir)
        monkeypatch.setattr(os, "mkdir", mkdir)
        commit.carry("model.pt", from_=1)
        commit.carry("tok/", from_=1)
        waiting = sorted(set(os.listdir(commit.path)) - {"new.bin"})
        assert len(waiting) == 3
        assert all((commit.path / name).is_file() for name in waiting)
    monkeypatch.undo()
    assert removed == []
    assert [os.path.basename(p) for p in made] == ["tok"]  # placed at the publish
    listed = sorted(os.listdir(ckpts.path_of(2)))
    assert [n for n in listed if n != MARKER] == ["model.pt", "new.bin", "tok"]
    ckpts.verify(2)
    ckpts.verify(1)
