"""Checkpoints a newer atomic_ckpt wrote (a marker format version above this one's) are
never trained over: a resume that would pick an older step below them refuses, saying
to upgrade or to move them; queries still answer, naming what they skip."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from atomic_ckpt import (
    MARKER,
    CheckpointDir,
    ManifestError,
    NewerCheckpointsError,
    NewerFormatError,
    UnusableCheckpointsError,
)
from atomic_ckpt import distributed as adist
from atomic_ckpt._core.l3_formats.marker import VERSION


def _commit(ckpts: CheckpointDir, step: int) -> None:
    with ckpts.commit(step) as path:
        (path / "model.bin").write_bytes(b"weights %d" % step)


def _as_if_newer(ckpts: CheckpointDir, step: int) -> None:
    """Rewrite step's marker as a release with the next format version would write it."""
    marker = ckpts.path_of(step) / MARKER
    raw = marker.read_bytes()
    newer = raw.replace(b'"version": %d' % VERSION, b'"version": %d' % (VERSION + 1), 1)
    assert newer != raw  # the version field was there to rewrite
    marker.write_bytes(newer)


@pytest.fixture
def root(tmp_path: Path) -> CheckpointDir:
    """Steps 1 and 2 written by this release, step 3 by a newer one."""
    ckpts = CheckpointDir(tmp_path / "run")
    for step in (1, 2, 3):
        _commit(ckpts, step)
    _as_if_newer(ckpts, 3)
    return ckpts


def test_a_resume_below_a_newer_format_checkpoint_refuses_saying_what_to_do(
    root: CheckpointDir,
) -> None:
    with pytest.raises(NewerCheckpointsError) as caught:
        root.resume_point()
    err = caught.value
    assert isinstance(err, UnusableCheckpointsError)
    assert isinstance(err, FileExistsError)
    assert err.paths == (root.path_of(3),)
    assert len(err.problems) == 1
    assert f"marker format version {VERSION + 1}" in err.problems[0]
    message = str(err)
    assert "newer than step 2" in message
    assert "Upgrade atomic_ckpt" in message
    assert "move them out of the root" in message
    assert sorted(p.name for p in root.root.iterdir()) == ["1", "2", "3"]  # nothing touched


def test_every_resume_path_refuses_alike(root: CheckpointDir) -> None:
    """Verified, with fresh (which starts over only when nothing is usable), and the
    distributed resume without a process group."""
    with pytest.raises(NewerCheckpointsError):
        root.resume_point(verify=True)
    with pytest.raises(NewerCheckpointsError):
        root.resume_verified(["model.bin"])
    with pytest.raises(NewerCheckpointsError):
        root.resume_point(fresh=True)
    with pytest.raises(NewerCheckpointsError):
        adist.resume(root)


def test_queries_still_answer_and_name_the_newer_checkpoint(
    root: CheckpointDir, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        latest = root.latest()
    assert latest is not None
    assert latest.step == 2
    assert any("written by a newer atomic_ckpt" in r.getMessage() for r in caplog.records)
    entry = {e.step: e for e in root.entries()}[3]
    assert entry.status == "invalid"
    assert entry.newer_format is True
    assert not {e.step: e for e in root.entries()}[2].newer_format


def test_reading_the_newer_marker_raises_a_manifest_error_of_its_own_kind(
    root: CheckpointDir,
) -> None:
    from atomic_ckpt._core.l3_formats.read import read_marker

    with pytest.raises(NewerFormatError, match="upgrade atomic_ckpt") as caught:
        read_marker(root.path_of(3))
    assert isinstance(caught.value, ManifestError)


def test_a_damaged_marker_above_a_usable_step_is_still_skipped(tmp_path: Path) -> None:
    """Not written by a newer release, just unreadable: the resume falls back to step 1
    (as before), with the skip logged."""
    ckpts = CheckpointDir(tmp_path / "run")
    _commit(ckpts, 1)
    _commit(ckpts, 2)
    (ckpts.path_of(2) / MARKER).write_bytes(b'{"format": "atomic_ckpt", "version": "two"}')
    found = ckpts.resume_point()
    assert found is not None
    assert found.step == 1


def test_only_newer_format_checkpoints_is_the_unusable_refusal(tmp_path: Path) -> None:
    """Nothing usable at all: the refusal of a root with nothing to resume from, whose
    problem line says a newer release wrote it."""
    ckpts = CheckpointDir(tmp_path / "run")
    _commit(ckpts, 5)
    _as_if_newer(ckpts, 5)
    with pytest.raises(UnusableCheckpointsError) as caught:
        ckpts.resume_point()
    assert not isinstance(caught.value, NewerCheckpointsError)
    assert "written by a newer atomic_ckpt" in caught.value.problems[0]


def test_the_refusal_to_commit_over_a_newer_format_says_marker_once(
    ckpts: CheckpointDir,
) -> None:
    """The StepConflictError over a newer release's checkpoint reads as one sentence (it
    said "its marker is marker <path>: ...")."""
    import json

    from atomic_ckpt import MARKER, StepConflictError

    with ckpts.commit(5) as path:
        (path / "a.bin").write_bytes(b"a")
    marker = ckpts.path_of(5) / MARKER
    doc = json.loads(marker.read_text())
    doc["version"] += 5
    marker.write_text(json.dumps(doc))
    with pytest.raises(StepConflictError) as raised, ckpts.commit(5) as path:
        (path / "a.bin").write_bytes(b"new")
    assert "marker is marker" not in str(raised.value)
    assert "a newer atomic_ckpt wrote" in str(raised.value)
