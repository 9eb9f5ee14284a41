"""distributed.resume_verified on real gloo ranks: the ranks share one verify, each hashing
what it loads, agree on the newest checkpoint that verifies everywhere, and read each byte
of it once."""

from __future__ import annotations

from pathlib import Path

from conftest import Runner
from dist_scenarios import SHARED, TIMEOUT, UNREAD, shard

from atomic_ckpt import CheckpointDir, VerifiedCheckpoint
from atomic_ckpt.distributed import resume_verified

SLACK = 20.0
"""How much longer than the timeout a survivor may take (process load on 2 cores)."""


def test_each_rank_gets_views_of_its_own_shard_and_the_shared_file(run_ranks: Runner) -> None:
    """Both ranks resume the newest step, with exactly the files they read, byte for byte."""
    results = run_ranks("verified_resume", 2)
    assert all(r.ok and r.data["error"] is None for r in results), results
    assert [r.data["step"] for r in results] == [2, 2]
    assert [r.data["views"] for r in results] == [
        sorted([shard(0), SHARED]),
        sorted([shard(1), SHARED]),
    ]
    assert all(r.data["exact"] for r in results)
    assert all(r.data["warnings"] == [] for r in results)


def test_a_damaged_file_only_rank_1_reads_makes_every_rank_fall_back(
    run_ranks: Runner, tmp_path: Path
) -> None:
    """Rank 1's own shard of step 2 is damaged: rank 1's check fails (rank 0 never reads that
    file), rank 0 warns naming rank 1 and the file, and both resume step 1."""
    results = run_ranks("verified_resume", 2, damage=[[2, shard(1)]])
    assert all(r.ok and r.data["error"] is None for r in results), results
    assert results[0].data["fired"] == [True]
    assert [r.data["step"] for r in results] == [1, 1]
    assert all(r.data["exact"] for r in results)
    assert shard(1) not in results[0].data["hashed"]  # so only rank 1 could have found it
    assert shard(1) in results[1].data["hashed"]
    [warning] = results[0].data["warnings"]
    assert "does not verify" in warning
    damaged = CheckpointDir(tmp_path / "ckpts").path_of(2) / shard(1)
    assert f"rank 1: {damaged}: xxh3_128 checksum is " in warning
    assert results[1].data["warnings"] == []  # rank 0 alone reports the skip


def test_a_damaged_file_nobody_reads_is_caught_by_rank_0(run_ranks: Runner, tmp_path: Path) -> None:
    """The file no rank reads is rank 0's to hash: its damage makes every rank fall back."""
    results = run_ranks("verified_resume", 2, damage=[[2, UNREAD]])
    assert all(r.ok and r.data["error"] is None for r in results), results
    assert results[0].data["fired"] == [True]
    assert [r.data["step"] for r in results] == [1, 1]
    assert UNREAD not in results[1].data["hashed"]
    [warning] = results[0].data["warnings"]
    damaged = CheckpointDir(tmp_path / "ckpts").path_of(2) / UNREAD
    assert f"rank 0: {damaged}: xxh3_128 checksum is " in warning


def test_when_no_checkpoint_verifies_every_rank_refuses_or_starts_fresh(run_ranks: Runner) -> None:
    """Both steps damaged: every rank raises UnusableCheckpointsError (a fresh start would
    train over them), and with ``fresh=True`` every rank gets None."""
    damaged = [[2, shard(1)], [1, UNREAD]]
    results = run_ranks("verified_resume", 2, damage=damaged)
    assert all(r.ok for r in results), results
    assert results[0].data["fired"] == [True, True]
    assert [r.data["error"] for r in results] == ["UnusableCheckpointsError"] * 2
    assert all("does not verify" in r.data["message"] for r in results)
    fresh = run_ranks("verified_resume", 2, damage=damaged, fresh=True)
    assert [(r.data["error"], r.data["step"]) for r in fresh] == [(None, None)] * 2


def test_disjoint_reads_that_cover_the_checkpoint_hash_each_byte_once(run_ranks: Runner) -> None:
    """Rank 0 reads its shard, the shared and the spare file, rank 1 its shard: between the
    two ranks every file of the checkpoint is hashed exactly once, all of it, and nothing
    else (the older step, never a candidate, is not read at all)."""
    reads = [[shard(0), SHARED, UNREAD], [shard(1)]]
    results = run_ranks("verified_resume", 2, reads=reads)
    assert all(r.ok and r.data["error"] is None for r in results), results
    assert [r.data["step"] for r in results] == [2, 2]
    assert all(r.data["exact"] for r in results)
    h0, h1 = results[0].data["hashed"], results[1].data["hashed"]
    assert set(h0) == set(reads[0])
    assert set(h1) == set(reads[1])
    assert sum(h0.values()) + sum(h1.values()) == results[0].data["total"]


def test_a_rank_killed_while_verifying_makes_the_others_raise_in_time(
    run_ranks: Runner, tmp_path: Path
) -> None:
    """SIGKILL of rank 1 in its part of the verify: rank 0 raises DistributedCommitError
    (never gloo's own error) within the timeout."""
    results = run_ranks("verified_resume_rank_fails", 2, victim=1, how="kill")
    assert (tmp_path / "out0" / "fired1").exists()
    assert results[1].exitcode == -9
    survivor = results[0].data
    assert survivor["error"] == "DistributedCommitError", survivor
    assert "lost contact" in survivor["message"]
    assert survivor["elapsed"] < TIMEOUT + SLACK


def test_a_rank_whose_part_fails_otherwise_is_named_on_every_rank(
    run_ranks: Runner, tmp_path: Path
) -> None:
    """An error other than a failed verify (MemoryError mapping a shard) on rank 1 is not a
    reason to fall back: rank 1 raises it, rank 0 a DistributedCommitError naming rank 1."""
    results = run_ranks("verified_resume_rank_fails", 2, victim=1, how="raise")
    assert (tmp_path / "out0" / "fired1").exists()
    assert results[1].data["error"] == "MemoryError"
    assert results[0].data["error"] == "DistributedCommitError"
    assert "rank(s) 1" in results[0].data["message"]
    assert "cannot map the shard on purpose" in results[0].data["message"]


def test_without_a_process_group_it_is_checkpoint_dir_resume_verified(tmp_path: Path) -> None:
    """A single process: the same checkpoint and views as ``ckpts.resume_verified``, None
    on an empty root, and the same refusal."""
    ckpts = CheckpointDir(tmp_path / "ckpts")
    assert resume_verified(ckpts, ["model.bin"]) is None
    for step in (1, 2):
        with ckpts.commit(step) as path:
            (path / "model.bin").write_bytes(bytes([step]) * 100)
            (path / "other.bin").write_bytes(b"not read")
    ours = resume_verified(ckpts, ["model.bin"])
    theirs = ckpts.resume_verified(["model.bin"])
    assert isinstance(ours, VerifiedCheckpoint)
    assert theirs is not None
    assert ours.checkpoint == theirs.checkpoint
    assert {k: bytes(v) for k, v in ours.files.items()} == {"model.bin": bytes([2]) * 100}
    assert {k: bytes(v) for k, v in theirs.files.items()} == {"model.bin": bytes([2]) * 100}
