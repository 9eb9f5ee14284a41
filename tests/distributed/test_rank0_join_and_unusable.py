"""On two gloo ranks: a joined ``rank0_commit`` block that raises aborts the enclosing commit
even if the caller swallows the error (issue 30 items 1 and 5: the same semantics on every
joining path, multi-rank too), and the multi-rank commits take ``replace_unusable``
(item 6)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import Runner

from atomic_ckpt import CheckpointDir


@pytest.mark.parametrize("raise_on", [[0, 1], [0]], ids=["every rank", "rank 0 only"])
def test_a_swallowed_error_in_a_joined_rank0_commit_publishes_the_step_on_no_rank(
    run_ranks: Runner, tmp_path: Path, raise_on: list[int]
) -> None:
    """Rank 0 writes the model, then half an optimizer file in a joined block that raises;
    the caller swallows the OSError. Step 9 is published on no rank: rank 0's outer block
    raises CommitStateError, rank 1's a CommitStateError of its own (its joined block
    raised too) or a DistributedCommitError naming rank 0; nothing is left behind."""
    results = run_ranks("rank0_join_swallowed", 2, raise_on=raise_on)
    assert all(r.exitcode == 0 and r.error is None for r in results), results
    for r in results:
        assert r.data["fired"] == ([r.rank] if r.rank in raise_on else [])
        assert r.data["steps"] == [], r.data
        assert r.data["left"] == [], r.data
    assert results[0].data["outer"] == "CommitStateError", results[0].data
    assert "half written on purpose" in results[0].data["message"]
    expected = "CommitStateError" if 1 in raise_on else "DistributedCommitError"
    assert results[1].data["outer"] == expected, results[1].data
    assert CheckpointDir(tmp_path / "ckpts").steps() == []


def test_an_error_joined_on_another_rank_is_that_rank_s_own(
    run_ranks: Runner, tmp_path: Path
) -> None:
    """Only rank 1's joined block raises (it writes nothing): rank 0's commit goes on and
    publishes step 9 whole; rank 1's outer block ends with CommitStateError."""
    results = run_ranks("rank0_join_swallowed", 2, raise_on=[1])
    assert all(r.exitcode == 0 and r.error is None for r in results), results
    assert results[1].data["fired"] == [1]
    assert results[0].data["outer"] is None
    assert results[1].data["outer"] == "CommitStateError"
    assert [r.data["steps"] for r in results] == [[9], [9]]
    files = sorted(e.path for e in CheckpointDir(tmp_path / "ckpts").verify(9).manifest.files)
    assert files == ["model.bin", "optimizer.bin"]


def test_multi_rank_commits_over_a_moved_checkpoint_need_replace_unusable(
    run_ranks: Runner, tmp_path: Path
) -> None:
    """A checkpoint moved to step 5 by hand: rank0_commit and distributed_commit refuse it
    on every rank (rank 0 StepConflictError naming the option, rank 1 a
    DistributedCommitError) and keep it; with replace_unusable=True both commit."""
    results = run_ranks("commit_over_moved", 2)
    assert all(r.exitcode == 0 and r.error is None for r in results), results
    for how in ("rank0_commit", "distributed_commit"):
        assert results[0].data[f"{how} False"].startswith("StepConflictError"), results[0].data
        assert "replace_unusable=True" in results[0].data[f"{how} False"]
        assert results[1].data[f"{how} False"].startswith("DistributedCommitError"), results[1]
        assert [r.data[f"{how} True"] for r in results] == ["committed", "committed"]
    assert [r.data["kept"] for r in results] == ["interrupt save"] * 2
    ckpts = CheckpointDir(tmp_path / "ckpts")
    assert ckpts.steps() == [5]
    assert ckpts.verify(5).manifest.step == 5


def test_a_full_disk_in_a_block_joined_on_another_rank_says_so(
    run_ranks: Runner, tmp_path: Path
) -> None:
    """Rank 1's joined block meets ENOSPC and the caller swallows it: the block raised a
    DiskFullError (as a single-process join does), and rank 1's outer block ends with a
    CommitStateError in the DiskFullError's words (the disk is full, free space), not a
    raw errno; rank 0's commit goes on."""
    results = run_ranks("rank0_join_swallowed", 2, raise_on=[1], enospc=True)
    assert all(r.exitcode == 0 and r.error is None for r in results), results
    one = results[1].data
    assert one["swallowed"].startswith("DiskFullError: "), one
    assert "is full" in one["swallowed"], one
    assert "Free space" in one["swallowed"], one
    assert one["outer"] == "CommitStateError", one
    assert "is full" in one["message"], one
    assert "Free space" in one["message"], one
    assert "Errno" not in one["message"].split("(")[0], one
    assert results[0].data["outer"] is None
    assert [r.data["steps"] for r in results] == [[9], [9]]
