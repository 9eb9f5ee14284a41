"""The scanner: which entries of a root are steps, which are complete; reading never writes."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest
from treeutil import snapshot, unmarked, with_marker

from atomic_ckpt import (
    MARKER,
    CheckpointDir,
    CheckpointNotFoundError,
)

LOGGER = "atomic_ckpt"


def commit(ckpts: CheckpointDir, step: int, payload: bytes = b"data") -> Path:
    with ckpts.commit(step) as path:
        (path / "model.bin").write_bytes(payload)
    return ckpts.path_of(step)


def warnings_about(caplog: pytest.LogCaptureFixture, path: Path) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and str(path) in r.getMessage()
    ]


# ---------------------------------------------------------------- completeness


def test_unmarked_dir_is_skipped_with_one_warning_and_latest_falls_back(
    ckpts: CheckpointDir, caplog: pytest.LogCaptureFixture
) -> None:
    """A newer unmarked directory is skipped (warned once); latest() is the newest complete one."""
    commit(ckpts, 3)
    commit(ckpts, 4)
    bad = unmarked(ckpts.root, "7")
    caplog.set_level(logging.WARNING, logger=LOGGER)
    latest = ckpts.latest()
    assert latest is not None
    assert latest.step == 4
    assert latest.path == ckpts.path_of(4)
    assert ckpts.steps() == [3, 4]
    ckpts.latest()
    (message,) = warnings_about(caplog, bad)
    assert "atomic-ckpt mark-complete" in message
    assert MARKER in message


def test_get_of_an_unmarked_step_says_how_to_adopt_it(ckpts: CheckpointDir) -> None:
    """get() of an unmarked directory is CheckpointNotFoundError pointing at mark-complete."""
    bad = unmarked(ckpts.root, "7")
    with pytest.raises(CheckpointNotFoundError, match="mark-complete") as info:
        ckpts.get(7)
    assert info.value.path == bad
    assert info.value.step == 7


def test_staging_dir_is_ignored_even_with_a_valid_marker(ckpts: CheckpointDir) -> None:
    """A `.tmp-` directory never counts, even if it holds a complete, valid manifest."""
    real = commit(ckpts, 3)
    for name in [
        "9.tmp-" + "a" * 32,
        "9.tmp-old-" + "b" * 32,
        "9.tmp-del-" + "c" * 32,
        "9.tmp-handmade",
        "10.tmp-",
    ]:
        shutil.copytree(real, ckpts.root / name)
    assert ckpts.steps() == [3]
    latest = ckpts.latest()
    assert latest is not None
    assert latest.step == 3


def test_legacy_empty_marker_is_complete(ckpts: CheckpointDir) -> None:
    """An empty (touched) marker makes a directory complete, with a legacy manifest."""
    with_marker(ckpts.root, "2", b"")
    ckpt = ckpts.get(2)
    assert ckpt.manifest.legacy
    assert ckpt.manifest.files == ()
    assert ckpts.steps() == [2]


@pytest.mark.parametrize(
    "marker",
    [
        pytest.param(b"{not json", id="invalid-json"),
        pytest.param(b"\xff\xfe\x00garbage", id="not-utf8"),
        pytest.param(
            json.dumps({"format": "atomic_ckpt", "version": 2, "files": []}).encode(),
            id="wrong-version",
        ),
        pytest.param(json.dumps({"format": "other", "version": 1, "files": []}).encode(), id="fmt"),
        pytest.param(json.dumps({"format": "atomic_ckpt", "version": 1}).encode(), id="no-files"),
        pytest.param(b"[1, 2, 3]", id="not-an-object"),
        pytest.param(b"null", id="null"),
        pytest.param(
            json.dumps(
                {"format": "atomic_ckpt", "version": 1, "files": [{"path": "../x", "size": 1}]}
            ).encode(),
            id="unsafe-path",
        ),
    ],
)
def test_invalid_marker_is_incomplete_with_a_warning(
    ckpts: CheckpointDir, caplog: pytest.LogCaptureFixture, marker: bytes
) -> None:
    """A marker that is not a valid manifest (bad JSON, wrong version, ...) is skipped, warned."""
    commit(ckpts, 1)
    bad = with_marker(ckpts.root, "5", marker)
    caplog.set_level(logging.WARNING, logger=LOGGER)
    assert ckpts.steps() == [1]
    latest = ckpts.latest()
    assert latest is not None
    assert latest.step == 1
    assert len(warnings_about(caplog, bad)) == 1
    with pytest.raises(CheckpointNotFoundError) as info:
        ckpts.get(5)
    assert info.value.step == 5


def test_marker_that_is_a_symlink_is_not_followed(ckpts: CheckpointDir, tmp_path: Path) -> None:
    """A marker that is a symlink (even to a valid manifest) does not make a directory complete."""
    real = commit(ckpts, 1)
    elsewhere = tmp_path / "elsewhere_marker"
    shutil.copyfile(real / MARKER, elsewhere)
    linked = unmarked(ckpts.root, "2")
    (linked / MARKER).symlink_to(elsewhere)
    assert ckpts.steps() == [1]


def test_marker_that_is_a_directory_is_not_complete(ckpts: CheckpointDir) -> None:
    """A directory named like the marker does not make a checkpoint complete."""
    path = unmarked(ckpts.root, "2")
    (path / MARKER).mkdir()
    assert ckpts.steps() == []


# ---------------------------------------------------------------- what is a step


def test_symlinks_and_files_are_never_steps(ckpts: CheckpointDir) -> None:
    """A symlink to a complete checkpoint and a plain file with a step name are not steps."""
    commit(ckpts, 3)
    (ckpts.root / "9").symlink_to(ckpts.path_of(3))
    (ckpts.root / "10").symlink_to("3")
    (ckpts.root / "11").write_bytes(b"")
    (ckpts.root / "checkpoint_best").symlink_to("3")
    assert ckpts.steps() == [3]
    latest = ckpts.latest()
    assert latest is not None
    assert latest.step == 3
    with pytest.raises(CheckpointNotFoundError):
        ckpts.get(9)
    with pytest.raises(CheckpointNotFoundError):
        ckpts.get(11)


@pytest.mark.parametrize(
    "name",
    ["007", "00", "+7", "-7", " 7", "7 ", "7\n", "1e3", "0x7", "7.0", "7a", "\u0667", "\uff17"],
)
def test_non_canonical_names_are_not_steps(ckpts: CheckpointDir, name: str) -> None:
    """Only ASCII decimal without leading zeros names a step (not 007, +7 or unicode digits)."""
    with_marker(ckpts.root, name, b"")
    commit(ckpts, 1)
    assert ckpts.steps() == [1]


def test_zero_is_a_step(ckpts: CheckpointDir) -> None:
    """Step 0 is a valid, canonical step."""
    with_marker(ckpts.root, "0", b"")
    assert ckpts.steps() == [0]


def test_steps_sort_numerically(ckpts: CheckpointDir) -> None:
    """steps() is ascending by number, not by name (2 before 10), and latest() is the largest."""
    for step in (10, 2, 100, 9):
        commit(ckpts, step)
    assert ckpts.steps() == [2, 9, 10, 100]
    assert [c.step for c in ckpts.checkpoints()] == [2, 9, 10, 100]
    latest = ckpts.latest()
    assert latest is not None
    assert latest.step == 100


def test_prefix_selects_prefixed_names_only(tmp_path: Path) -> None:
    """With prefix="checkpoint-" the steps are `checkpoint-N`; `N` and `checkpoint-0N` are not."""
    with_marker(tmp_path, "checkpoint-5")
    with_marker(tmp_path, "checkpoint-12")
    with_marker(tmp_path, "checkpoint-007")
    with_marker(tmp_path, "checkpoint-")
    with_marker(tmp_path, "7")
    with_marker(tmp_path, "ckpt-8")
    prefixed = CheckpointDir(tmp_path, prefix="checkpoint-")
    assert prefixed.steps() == [5, 12]
    assert prefixed.get(5).path == tmp_path / "checkpoint-5"
    assert CheckpointDir(tmp_path).steps() == [7]


# ---------------------------------------------------------------- reading never writes


def test_missing_root_has_no_checkpoints_and_is_never_created(tmp_path: Path) -> None:
    """Reading a missing root returns nothing and creates neither it nor its parents."""
    ckpts = CheckpointDir(tmp_path / "missing" / "root")
    assert ckpts.latest() is None
    assert ckpts.steps() == []
    assert ckpts.checkpoints() == []
    assert ckpts.clean() == []
    assert ckpts.clean(dry_run=True) == []
    assert ckpts.prune(keep_last=1) == []
    with pytest.raises(CheckpointNotFoundError):
        ckpts.get(0)
    with pytest.raises(CheckpointNotFoundError):
        ckpts.verify(0)
    assert os.listdir(tmp_path) == []


def test_root_under_a_file_reads_as_empty(tmp_path: Path) -> None:
    """A root whose parent is a plain file simply has no checkpoints when read."""
    (tmp_path / "file").write_bytes(b"")
    ckpts = CheckpointDir(tmp_path / "file" / "root")
    assert ckpts.steps() == []
    assert ckpts.latest() is None


def test_scanning_never_writes_renames_or_repairs(ckpts: CheckpointDir) -> None:
    """latest(), steps() and get() leave a messy root byte-for-byte as they found it."""
    real = commit(ckpts, 3)
    unmarked(ckpts.root, "4")
    with_marker(ckpts.root, "5", b"{corrupt")
    shutil.copytree(real, ckpts.root / ("6.tmp-" + "d" * 32))
    # A fallback replace interrupted in its window: no 8/ but a complete old copy aside.
    shutil.copytree(real, ckpts.root / ("8.tmp-old-" + "e" * 32))
    (ckpts.root / ("6.tmp-" + "d" * 32 + ".lock")).write_bytes(b"")
    before = snapshot(ckpts.root)
    fresh = CheckpointDir(ckpts.root)
    assert fresh.steps() == [3]
    assert fresh.latest() is not None
    assert fresh.get(3).step == 3
    with pytest.raises(CheckpointNotFoundError):
        fresh.get(8)
    assert snapshot(ckpts.root) == before


def test_a_fresh_checkpoint_dir_sees_committed_steps(ckpts: CheckpointDir) -> None:
    """Nothing is cached: a second CheckpointDir on the same root sees every commit."""
    other = CheckpointDir(ckpts.root)
    assert other.steps() == []
    commit(ckpts, 1)
    assert other.steps() == [1]
    commit(other, 2)
    assert ckpts.steps() == [1, 2]


# ---------------------------------------------------------------- hostile entries


def test_marker_that_is_a_fifo_does_not_hang_the_scanner(ckpts: CheckpointDir) -> None:
    """A FIFO planted as the marker makes the step incomplete; the scan does not block on it."""
    commit(ckpts, 1)
    trap = unmarked(ckpts.root, "2")
    os.mkfifo(trap / MARKER)
    assert ckpts.steps() == [1]  # would block forever if the marker were opened blocking
    assert ckpts.latest() is not None
