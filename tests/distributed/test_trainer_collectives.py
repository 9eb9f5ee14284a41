"""Issue 14 on real gloo ranks: a collective commit called on rank 0 only fails fast, and
resume() refuses a root of unmarked checkpoints on every rank."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import Runner
from dist_scenarios import ENTRY_TIMEOUT

from atomic_ckpt import CheckpointDir

SLACK = 10.0
"""How much longer than the entry timeout rank 0 may take (process load on 2 cores)."""
DEADLINE = 40.0
"""The other ranks' barrier times out after 30 s (the default group's timeout), so a rank
still running at 40 s is the one that hung."""


@pytest.mark.parametrize("warm", [True, False], ids=["after-a-collective-commit", "first-call"])
def test_a_commit_called_on_rank0_only_fails_fast_naming_the_misuse(
    run_ranks: Runner, tmp_path: Path, warm: bool
) -> None:
    """distributed_commit inside `if rank == 0:` raises DistributedCommitError within about
    entry_timeout, saying it is collective; nothing is promoted; the barrier then completes."""
    results = run_ranks("commit_on_rank0_only", 2, deadline=DEADLINE, warm=warm)
    assert all(r.ok for r in results), results
    r0 = results[0].data
    assert r0["error"] == "DistributedCommitError", r0
    assert "collective" in r0["message"]
    assert "rank == 0" in r0["message"]
    assert ENTRY_TIMEOUT * 0.5 <= r0["elapsed"] < ENTRY_TIMEOUT + SLACK
    ckpts = CheckpointDir(tmp_path / "ckpts")
    assert 2 not in ckpts.steps()
    ckpts.clean()


def test_a_collective_commit_after_a_detected_misuse_still_works(
    run_ranks: Runner, tmp_path: Path
) -> None:
    """Once the misuse is fixed (every rank calls it), the next commit succeeds."""
    results = run_ranks(
        "commit_on_rank0_only", 2, deadline=DEADLINE, warm=True, then_collective=True
    )
    assert all(r.ok for r in results), results
    assert results[0].data["error"] == "DistributedCommitError"
    assert results[0].data["steps"] == [1, 3]


def test_resume_refuses_an_unmarked_root_on_every_rank_unless_fresh(
    run_ranks: Runner, tmp_path: Path
) -> None:
    """Every rank raises UnmarkedCheckpointsError naming the dirs; fresh=True gives None."""
    for step in (0, 1):
        (tmp_path / "ckpts" / str(step)).mkdir(parents=True)
        (tmp_path / "ckpts" / str(step) / "model.pt").write_bytes(b"legacy")
    results = run_ranks("resume_unmarked", 2)
    assert all(r.ok for r in results), results
    for r in results:
        assert r.data["plain"] == "UnmarkedCheckpointsError", r
        assert "mark-complete" in r.data["message"]
        assert r.data["fresh"] is True
    assert results[0].data["paths"] == ["0", "1"]


def test_resume_refuses_a_root_of_unreadable_markers_on_every_rank_unless_fresh(
    run_ranks: Runner, tmp_path: Path
) -> None:
    """A step whose marker is of a newer format version: every rank raises rank 0's
    UnusableCheckpointsError saying why, not None; fresh=True gives None."""
    step = tmp_path / "ckpts" / "4"
    step.mkdir(parents=True)
    (step / "model.pt").write_bytes(b"newer")
    (step / "checkpoint_complete").write_text('{"format": "atomic_ckpt", "version": 3}')
    results = run_ranks("resume_unmarked", 2)
    assert all(r.ok for r in results), results
    for r in results:
        assert r.data["plain"] == "UnusableCheckpointsError", r
        assert "version 3" in r.data["message"]
        assert r.data["paths"] == ["4"]
        assert r.data["fresh"] is True
