"""mark_complete(): adopting a directory written without the library (``_adopt``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from treeutil import unmarked, with_marker

from atomic_ckpt import (
    MARKER,
    CheckpointDir,
    CheckpointNotFoundError,
    InvalidStepError,
    StepConflictError,
    VerificationError,
)
from atomic_ckpt._core.l2_syscalls import fs as _fs


def commit(ckpts: CheckpointDir, step: int, payload: bytes = b"data") -> Path:
    with ckpts.commit(step) as path:
        (path / "model.bin").write_bytes(payload)
    return ckpts.path_of(step)


# ---------------------------------------------------------------- adopting old checkpoints


def test_mark_complete_makes_an_unmarked_dir_visible_to_a_fresh_reader(
    ckpts: CheckpointDir, tmp_path: Path
) -> None:
    """mark_complete(N) fsyncs and records an unmarked dir; a new CheckpointDir resumes from it."""
    commit(ckpts, 3)
    legacy = unmarked(ckpts.root, "7")
    (legacy / "opt").mkdir()
    (legacy / "opt" / "state.pt").write_bytes(b"adam")
    (legacy / "best").symlink_to("model.bin")
    latest = ckpts.latest()
    assert latest is not None
    assert latest.step == 3
    synced: list[Path] = []
    real = _fs.fsync_file

    def fsync_file(path: str | os.PathLike[str]) -> None:
        synced.append(Path(path))
        real(path)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(_fs, "fsync_file", fsync_file)
        adopted = ckpts.mark_complete(7)
    assert set(synced) == {legacy / "model.bin", legacy / "opt" / "state.pt"}
    assert adopted.step == 7
    assert adopted.path == legacy
    fresh = CheckpointDir(ckpts.root).latest()
    assert fresh is not None
    assert fresh.step == 7
    entries = {(e.path, e.type) for e in fresh.manifest.files}
    assert entries == {
        ("model.bin", "file"),
        ("opt", "dir"),
        ("opt/state.pt", "file"),
        ("best", "symlink"),
    }
    assert not fresh.manifest.legacy
    assert fresh.manifest.metadata == {"adopted": True}
    CheckpointDir(ckpts.root).verify(7)


def test_mark_complete_upgrades_a_legacy_empty_marker(ckpts: CheckpointDir) -> None:
    """An empty (touched) marker is replaced by a full manifest that verify() can check."""
    path = with_marker(ckpts.root, "4", b"")
    assert ckpts.get(4).manifest.legacy
    ckpt = ckpts.mark_complete(4)
    assert not ckpt.manifest.legacy
    doc = json.loads((path / MARKER).read_bytes())
    assert [f["path"] for f in doc["files"]] == ["model.bin"]
    assert not ckpts.get(4).manifest.legacy
    (path / "model.bin").write_bytes(b"changed size")
    with pytest.raises(VerificationError):
        ckpts.verify(4)


def test_mark_complete_leaves_a_manifest_marker_unchanged(ckpts: CheckpointDir) -> None:
    """A checkpoint that already has a manifest is returned as is, its marker untouched."""
    path = commit(ckpts, 2)
    before = (path / MARKER).read_bytes()
    assert ckpts.mark_complete(2) == ckpts.get(2)
    assert (path / MARKER).read_bytes() == before


def test_mark_complete_works_with_a_prefix(tmp_path: Path) -> None:
    """mark_complete adopts `checkpoint-N` under prefix="checkpoint-"."""
    unmarked(tmp_path, "checkpoint-9")
    ckpts = CheckpointDir(tmp_path, prefix="checkpoint-")
    assert ckpts.mark_complete(9).path == tmp_path / "checkpoint-9"
    assert ckpts.steps() == [9]


def test_mark_complete_of_something_that_is_not_a_directory(
    ckpts: CheckpointDir, tmp_path: Path
) -> None:
    """Adopting a missing step is CheckpointNotFoundError; a file or a symlink StepConflictError."""
    commit(ckpts, 1)
    with pytest.raises(CheckpointNotFoundError):
        ckpts.mark_complete(5)
    (ckpts.root / "6").write_bytes(b"")
    (ckpts.root / "7").symlink_to(ckpts.path_of(1))
    for step in (6, 7):
        with pytest.raises(StepConflictError):
            ckpts.mark_complete(step)
    assert ckpts.steps() == [1]


def test_mark_complete_on_a_missing_root_creates_nothing(tmp_path: Path) -> None:
    """mark_complete() under a missing root raises CheckpointNotFoundError and creates no root."""
    ckpts = CheckpointDir(tmp_path / "missing")
    with pytest.raises(CheckpointNotFoundError):
        ckpts.mark_complete(1)
    assert not ckpts.root.exists()


@pytest.mark.parametrize("step", [-1, -100, True, False, 1.0, 2.5, "3", None, b"4"])
def test_mark_complete_of_an_invalid_step_is_an_invalid_step_error(
    ckpts: CheckpointDir, step: Any
) -> None:
    """A negative, bool, float or str step is InvalidStepError (a ValueError); nothing is made."""
    with pytest.raises(InvalidStepError) as info:
        ckpts.mark_complete(step)
    assert isinstance(info.value, ValueError)
    assert info.value.step == (step if type(step) is int else None)
    assert not ckpts.root.exists()
