"""A directory (not a file) named ``checkpoint_complete`` inside a step directory is what
it is: an unusable checkpoint whose reason says so and what to do. Reading reports it and
never crashes; ``mark_complete`` and a commit over it refuse it (before anything is
written) instead of failing with a bare IsADirectoryError; nothing deletes it unasked; a
save that writes such a directory is refused, naming it."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from atomic_ckpt import (
    MARKER,
    CheckpointDir,
    CheckpointNotFoundError,
    MarkerIsDirectoryError,
    StepConflictError,
    UnusableCheckpointsError,
)


def _root_with_marker_dir(tmp_path: Path) -> tuple[CheckpointDir, Path]:
    """Step 3 complete; step 5 has its files and a directory (holding a file) as marker."""
    ckpts = CheckpointDir(tmp_path / "root")
    with ckpts.commit(3) as path:
        (path / "w").write_bytes(b"3")
    step5 = tmp_path / "root" / "5"
    (step5 / MARKER).mkdir(parents=True)
    (step5 / MARKER / "note").write_bytes(b"user data")
    (step5 / "w").write_bytes(b"5")
    return ckpts, step5


def _kept(step5: Path) -> None:
    assert (step5 / MARKER / "note").read_bytes() == b"user data"
    assert (step5 / "w").read_bytes() == b"5"
    assert sorted(p.name for p in step5.iterdir()) == [MARKER, "w"]


def test_reading_reports_it_as_unusable_with_the_remedy(tmp_path: Path) -> None:
    """Scan, entries, get and verify call it invalid: a directory, and what to do."""
    ckpts, step5 = _root_with_marker_dir(tmp_path)
    assert ckpts.steps() == [3]
    (entry,) = [e for e in ckpts.entries() if e.step == 5]
    assert entry.status == "invalid"
    assert entry.problem is not None
    assert "is a directory" in entry.problem
    assert "mark-complete" in entry.problem
    for call in (ckpts.get, ckpts.verify):
        with pytest.raises(CheckpointNotFoundError, match="is a directory"):
            call(5)
    _kept(step5)


def test_a_resume_with_nothing_else_names_it(tmp_path: Path) -> None:
    """With no complete checkpoint, the resume's refusal lists it with the reason."""
    ckpts, step5 = _root_with_marker_dir(tmp_path)
    ckpts.delete(3)
    with pytest.raises(UnusableCheckpointsError, match="is a directory"):
        ckpts.resume_point()
    _kept(step5)


def test_a_resume_stops_at_it_above_the_newest_complete_step(tmp_path: Path) -> None:
    """Step 3 is complete, step 5 above it has a directory as marker: the resume refuses
    (as at a moved checkpoint), since training on from 3 would reach 5, whose commit is
    refused. It used to resume from 3 with a warning."""
    ckpts, step5 = _root_with_marker_dir(tmp_path)
    with pytest.raises(UnusableCheckpointsError, match="is a directory") as caught:
        ckpts.resume_point()
    assert caught.value.paths == (step5,)
    assert "above step 3" in str(caught.value)
    _kept(step5)


def test_mark_complete_refuses_it_and_changes_nothing(tmp_path: Path) -> None:
    """mark_complete raised a bare IsADirectoryError from the marker's rename."""
    ckpts, step5 = _root_with_marker_dir(tmp_path)
    with pytest.raises(MarkerIsDirectoryError, match="Move that directory out") as caught:
        ckpts.mark_complete(5)
    assert isinstance(caught.value, IsADirectoryError)
    assert caught.value.path == step5 / MARKER
    _kept(step5)


def test_a_commit_over_it_is_refused_unless_replace_unusable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """It was replaced (and what the directory held deleted) with only a warning."""
    ckpts, step5 = _root_with_marker_dir(tmp_path)
    with pytest.raises(StepConflictError, match="is a directory"), ckpts.commit(5) as path:
        (path / "w").write_bytes(b"new")
    _kept(step5)
    with caplog.at_level(logging.WARNING), ckpts.commit(5, replace_unusable=True) as path:
        (path / "w").write_bytes(b"new")
    assert "replace_unusable=True" in caplog.text
    assert ckpts.get(5).path.joinpath("w").read_bytes() == b"new"


def test_a_save_that_writes_such_a_directory_is_refused(tmp_path: Path) -> None:
    """The commit failed with a bare IsADirectoryError naming its staging directory."""
    ckpts = CheckpointDir(tmp_path / "root")
    commit = ckpts.begin(1)
    (commit.path / "w").write_bytes(b"1")
    (commit.path / MARKER).mkdir()
    with pytest.raises(MarkerIsDirectoryError, match="reserved") as caught:
        commit.publish()
    commit.abort()
    assert isinstance(caught.value, IsADirectoryError)
    assert ckpts.steps() == []
    assert list((tmp_path / "root").iterdir()) == []


@pytest.mark.parametrize("argv", [["ls"], ["verify"], ["verify", "5"], ["latest"]])
def test_the_cli_reports_it(tmp_path: Path, argv: list[str]) -> None:
    """Every read-only command says what it is, with no traceback."""
    _, step5 = _root_with_marker_dir(tmp_path)
    root = str(tmp_path / "root")
    args = [argv[0], root, *argv[1:]]
    got = subprocess.run(
        [sys.executable, "-m", "atomic_ckpt.cli", *args],
        check=False,
        capture_output=True,
        text=True,
    )
    out = got.stdout + got.stderr
    assert "Traceback" not in out
    assert "IsADirectoryError" not in out
    if argv != ["latest"]:
        assert "is a directory" in out or "invalid" in out
    _kept(step5)


def test_the_cli_mark_complete_refuses_it(tmp_path: Path) -> None:
    """``atomic-ckpt mark-complete`` exits with the reason, not an errno string."""
    _, step5 = _root_with_marker_dir(tmp_path)
    got = subprocess.run(
        [sys.executable, "-m", "atomic_ckpt.cli", "mark-complete", str(step5)],
        check=False,
        capture_output=True,
        text=True,
    )
    assert got.returncode != 0
    assert "is a directory" in got.stderr
    assert "Errno" not in got.stderr
    _kept(step5)
