"""Multi-rank commit and resume on real gloo ranks (CPU processes), 2 and 4 of them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import Runner
from dist_scenarios import TIMEOUT, payload

from atomic_ckpt import BEST_LINK, MARKER, TMP_INFIX, CheckpointDir

SLACK = 20.0
"""How much longer than the commit timeout a survivor may take (process load on 2 cores)."""


def leftovers(root: Path) -> list[str]:
    return sorted(n for n in os.listdir(root) if TMP_INFIX in n and "root.lock" not in n)


@pytest.mark.parametrize("world", [2, 4])
def test_commit_lists_every_ranks_files(run_ranks: Runner, tmp_path: Path, world: int) -> None:
    """Every rank writes into one staging dir; rank 0's manifest lists all files, checksummed."""
    results = run_ranks("commit", world)
    assert all(r.ok for r in results), results
    assert len({r.data["staging"] for r in results}) == 1  # one name, broadcast by rank 0
    assert all(r.data["visible"] == "1" for r in results)
    ckpts = CheckpointDir(tmp_path / "ckpts")
    ckpt = ckpts.verify(1)
    files = {e.path: e for e in ckpt.manifest.files}
    for rank in range(world):
        entry = files[f"shard.rank{rank}.bin"]
        assert entry.size == 1000
        assert entry.checksum is not None
        assert (ckpt.path / entry.path).read_bytes() == payload(rank, 1)
        assert files[f"sub{rank}/extra.bin"].checksum is not None
        assert files[f"sub{rank}"].type == "dir"
    assert ckpt.manifest.metadata == {"loss": 0.5}
    assert leftovers(ckpts.root) == []


def test_replacing_a_step_keeps_one_complete_copy(run_ranks: Runner, tmp_path: Path) -> None:
    """Committing an existing step again replaces it atomically with the new contents."""
    results = run_ranks("replace", 2)
    assert all(r.ok for r in results), results
    ckpts = CheckpointDir(tmp_path / "ckpts")
    assert ckpts.steps() == [5]
    ckpt = ckpts.verify(5)
    assert ckpt.manifest.metadata == {"round": 1}
    assert (ckpt.path / "shard.rank1.bin").read_bytes() == payload(1, 1)
    assert leftovers(ckpts.root) == []


@pytest.mark.parametrize(("world", "victim"), [(2, 1), (4, 2), (2, 0)])
def test_one_rank_raising_makes_every_rank_raise(
    run_ranks: Runner, tmp_path: Path, world: int, victim: int
) -> None:
    """One rank's exception: it re-raises its own, the others name it; nothing is promoted."""
    results = run_ranks("rank_raises", world, victim=victim)
    assert results[victim].error == "ValueError"  # the fault fired
    assert "disk full on purpose" in results[victim].message
    for r in results:
        if r.rank != victim:
            assert r.error == "DistributedCommitError", r
            assert f"rank(s) {victim}" in r.message
            assert "disk full on purpose" in r.message
    ckpts = CheckpointDir(tmp_path / "ckpts")
    assert ckpts.steps() == []
    assert leftovers(ckpts.root) == []  # rank 0 removed the staging dir and its lock


@pytest.mark.parametrize(("world", "victim"), [(2, 1), (4, 3), (2, 0)])
def test_a_killed_rank_makes_survivors_raise_in_time(
    run_ranks: Runner, tmp_path: Path, world: int, victim: int
) -> None:
    """A SIGKILLed rank: survivors raise within the timeout, nothing is promoted, clean() tidies."""
    results = run_ranks("rank_killed", world, victim=victim)
    assert results[victim].exitcode == -9  # the fault fired
    assert (tmp_path / "out0" / "killed").exists()
    for r in results:
        if r.rank != victim:
            assert r.error == "DistributedCommitError", r
            assert r.elapsed < TIMEOUT + SLACK
    ckpts = CheckpointDir(tmp_path / "ckpts")
    assert ckpts.steps() == []
    ckpts.clean()
    assert leftovers(ckpts.root) == []


def test_a_hung_rank_makes_survivors_raise_after_the_timeout(
    run_ranks: Runner, tmp_path: Path
) -> None:
    """A rank stuck in its save: the others give up after the timeout with a clear error."""
    results = run_ranks("rank_hangs", 2, victim=1)
    r0 = results[0]
    assert r0.error == "DistributedCommitError", r0
    assert "lost contact" in r0.message
    assert TIMEOUT * 0.5 <= r0.elapsed < TIMEOUT + SLACK
    ckpts = CheckpointDir(tmp_path / "ckpts")
    assert ckpts.steps() == []
    ckpts.clean()
    assert leftovers(ckpts.root) == []


@pytest.mark.parametrize("replace", [False, True])
def test_rank0_killed_after_marker_before_rename(
    run_ranks: Runner, tmp_path: Path, replace: bool
) -> None:
    """Rank 0 dies with the marker written but before promotion: only a staging dir remains."""
    ckpts = CheckpointDir(tmp_path / "ckpts")
    if replace:
        with ckpts.commit(3) as path:
            (path / "old.bin").write_bytes(b"old")
    results = run_ranks("rank0_killed_before_rename", 2, step=3)
    assert results[0].exitcode == -9
    fired = json.loads((tmp_path / "out0" / "fired").read_text())
    assert fired[1] is True  # the marker was in place when rank 0 died
    assert results[1].error == "DistributedCommitError", results[1]
    staging = ckpts.root / fired[0]
    assert (staging / MARKER).is_file()
    # The scanner ignores the marked staging dir; the old step (if any) is intact.
    assert ckpts.steps() == ([3] if replace else [])
    if replace:
        assert (ckpts.verify(3).path / "old.bin").read_bytes() == b"old"
    removed = ckpts.clean()
    assert staging in removed
    assert leftovers(ckpts.root) == []


@pytest.mark.parametrize("world", [2, 4])
def test_resume_is_chosen_by_rank0_and_agreed(
    run_ranks: Runner, tmp_path: Path, world: int
) -> None:
    """resume(): rank 0 scans and broadcasts; every rank gets the same step and its own shard."""
    results = run_ranks("resume_agreement", world)
    assert all(r.ok for r in results), results
    assert [r.data for r in results] == [{"step": 3, "own_shard_ok": True}] * world


def test_resume_with_verify_skips_a_corrupt_latest(run_ranks: Runner) -> None:
    """resume(verify=True): rank 0 falls back past a corrupt latest, and every rank agrees."""
    results = run_ranks("resume_agreement", 2, corrupt_latest=True)
    assert all(r.ok for r in results), results
    assert [r.data["step"] for r in results] == [2, 2]


def test_resume_with_no_checkpoint_is_none_everywhere(run_ranks: Runner) -> None:
    """resume() on an empty (missing) root is None on every rank."""
    results = run_ranks("resume_empty", 2)
    assert [r.data for r in results] == [{"none": True}] * 2


def test_dcp_save_inside_a_commit_round_trips_exactly(run_ranks: Runner, tmp_path: Path) -> None:
    """dcp.save into the staging dir, then dcp.load from the promoted dir: bit-exact."""
    results = run_ranks("dcp_roundtrip", 2)
    assert all(r.ok for r in results), results
    assert all(r.data["exact"] for r in results)
    files = results[0].data["files"]
    assert ".metadata" in files
    assert any(f.endswith(".distcp") for f in files)
    CheckpointDir(tmp_path / "ckpts").verify(7)


def test_retention_runs_on_rank0_only_after_each_commit(run_ranks: Runner, tmp_path: Path) -> None:
    """retain= in a multi-rank commit: rank 0 alone deletes; last 2 and the best survive."""
    results = run_ranks("retain", 2)
    assert all(r.ok for r in results), results
    ckpts = CheckpointDir(tmp_path / "ckpts")
    assert ckpts.steps() == [2, 4, 5]
    assert os.readlink(ckpts.root / BEST_LINK) == "2"
    best = ckpts.best()
    assert best is not None
    assert best.step == 2


@pytest.mark.parametrize("how", ["destroy", "keep"])
def test_ranks_exit_cleanly_after_a_commit(tmp_path: Path, how: str) -> None:
    """A training script that commits and ends normally exits 0 (no abort at interpreter exit).

    The cached coordination group once outlived the default group at teardown
    and the process aborted (exit -6) in about 3 runs of 8; 3 runs here.
    """
    import subprocess
    import sys

    script = Path(__file__).with_name("exit_cleanly.py")
    for i in range(3):
        proc = subprocess.run(
            [sys.executable, str(script), str(tmp_path / f"r{i}"), str(tmp_path / f"i{i}"), how],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
        assert CheckpointDir(tmp_path / f"r{i}").steps() == [1]


@pytest.mark.parametrize("world", [2, 4])
def test_each_declared_file_is_fsynced_once_by_its_writer(
    run_ranks: Runner, tmp_path: Path, world: int
) -> None:
    """With every file declared, a commit makes files + directories + 4 fsyncs in all (the
    marker, the staging dir, the root, the root's parent at its creation), whatever the
    number of ranks; each rank other than 0 fsyncs exactly its own 2 files."""
    results = run_ranks("fsync_count", world, declare=True)
    assert all(r.ok for r in results), results
    counts = [r.data["fsync"] for r in results]
    files, dirs = 2 * world, world
    assert sum(counts) == files + dirs + 4, counts
    assert counts[1:] == [2] * (world - 1), counts
    ckpt = CheckpointDir(tmp_path / "ckpts").verify(1)
    listed = [e for e in ckpt.manifest.files if e.type == "file"]
    assert len(listed) == files
    assert all(e.checksum is not None for e in listed)


def test_undeclared_files_are_swept_by_every_rank_that_did_not_declare(
    run_ranks: Runner, tmp_path: Path
) -> None:
    """rank_path names only (the file beside them undeclared): each rank fsyncs its own
    shard once and sweeps the undeclared files (it may have written them); the commit is
    complete and checksummed as before."""
    world = 2
    results = run_ranks("fsync_count", world)
    assert all(r.ok for r in results), results
    counts = [r.data["fsync"] for r in results]
    assert counts[1] == 1 + world, counts  # its shard + every undeclared extra.bin
    ckpt = CheckpointDir(tmp_path / "ckpts").verify(1)
    assert all(e.checksum is not None for e in ckpt.manifest.files if e.type == "file")


def test_declare_outside_a_commit_raises(tmp_path: Path) -> None:
    """declare() names files of an open distributed_commit; anywhere else it is a misuse."""
    from atomic_ckpt import CommitStateError
    from atomic_ckpt.distributed import declare

    with pytest.raises(CommitStateError, match="not inside the staging directory"):
        declare(tmp_path / "model.pt")


def test_files_no_rank_declared_are_fsynced_by_rank_0(run_ranks: Runner, tmp_path: Path) -> None:
    """Every rank called declare() but also wrote a file it did not declare: the other ranks
    fsync only what they declared, and rank 0 sweeps (fsyncs) every undeclared file, so no
    file of the checkpoint goes unflushed."""
    world = 2
    results = run_ranks("fsync_count_one_undeclared", world)
    assert all(r.ok for r in results), results
    counts = [r.data["fsync"] for r in results]
    assert counts[1:] == [1] * (world - 1), counts  # its own shard only
    # shards + undeclared files, each once, + the marker, staging dir, root, root's parent
    assert sum(counts) == world + world + 4, counts
    ckpt = CheckpointDir(tmp_path / "ckpts").verify(1)
    assert {f"loose{r}.bin" for r in range(world)} <= {e.path for e in ckpt.manifest.files}
