"""atomic_ckpt.dcp.AtomicWriter on real gloo ranks (CPU processes): torch DCP saves that
commit atomically and durably, and fail cleanly on every rank."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from dcp_scenarios import PG_TIMEOUT, TIMEOUT
from ranks import Runner

from atomic_ckpt import MARKER, TMP_INFIX, CheckpointDir

SLACK = 20.0
"""How much longer than the timeouts a survivor may take (process load on 2 cores)."""


def leftovers(root: Path) -> list[str]:
    return sorted(n for n in os.listdir(root) if TMP_INFIX in n and "root.lock" not in n)


def shards_of(ckpts: CheckpointDir, step: int) -> dict[int, int]:
    """How many .distcp files each rank wrote (``__<rank>_<i>.distcp``)."""
    out: dict[int, int] = {}
    for e in ckpts.get(step).manifest.files:
        if e.path.endswith(".distcp"):
            rank = int(e.path.split("_")[2])
            out[rank] = out.get(rank, 0) + 1
    return out


@pytest.mark.parametrize(
    ("api", "world"),
    [("plain", 2), ("plain_async", 2), ("wrapper", 2), ("wrapper_async", 2), ("plain", 4)],
)
def test_save_commits_loads_exactly_and_fsyncs_each_file_once(
    run_dcp: Runner, tmp_path: Path, api: str, world: int
) -> None:
    """dcp.save / dcp.async_save with an AtomicWriter (or our wrappers): a complete, verified
    checkpoint that plain dcp.load reads back bit-exact after resume(); each file is fsynced
    once, by its writer: files + 4 fsyncs in all (.metadata counted as a file; the marker,
    the staging dir, the root, the root's parent at its creation), whatever the rank count."""
    results = run_dcp("save_load", world, api=api)
    assert all(r.ok for r in results), results
    assert all(r.data["exact"] and r.data["step"] == 1 for r in results)
    ckpts = CheckpointDir(tmp_path / "ckpts")
    ckpt = ckpts.verify(1)
    assert ckpt.manifest.metadata == {"loss": 0.5}
    files = [e for e in ckpt.manifest.files if e.type == "file"]
    assert ".metadata" in {e.path for e in files}
    assert all(e.checksum is not None for e in files)
    counts = [r.data["fsync"] for r in results]
    assert sum(counts) == len(files) + 4, counts
    shards = shards_of(ckpts, 1)
    assert [counts[r] for r in range(1, world)] == [shards.get(r, 0) for r in range(1, world)]
    assert leftovers(ckpts.root) == []


def test_thread_count_files_are_all_committed(run_dcp: Runner, tmp_path: Path) -> None:
    """thread_count=3 writes 3 files per rank (some empty): all listed, all fsynced once."""
    results = run_dcp("save_load", 2, api="plain", threads=3)
    assert all(r.ok for r in results), results
    ckpts = CheckpointDir(tmp_path / "ckpts")
    assert shards_of(ckpts, 1) == {0: 3, 1: 3}
    files = [e for e in ckpts.verify(1).manifest.files if e.type == "file"]
    assert sum(r.data["fsync"] for r in results) == len(files) + 4


def test_resaving_a_step_replaces_it_whole(run_dcp: Runner, tmp_path: Path) -> None:
    """A second save of an existing step replaces it atomically: it loads as the second."""
    results = run_dcp("resave", 2)
    assert all(r.ok for r in results), results
    assert all(r.data == {"step": 3, "exact": True} for r in results)
    ckpts = CheckpointDir(tmp_path / "ckpts")
    assert ckpts.steps() == [3]
    assert ckpts.verify(3).manifest.metadata == {"seed": 2}
    assert leftovers(ckpts.root) == []


@pytest.mark.parametrize(
    ("api", "world", "victim"),
    [
        ("wrapper", 2, 1),
        ("wrapper", 2, 0),
        ("wrapper_async", 2, 1),
        ("plain", 2, 1),
        ("plain_async", 2, 1),
        ("wrapper", 4, 2),
    ],
)
def test_a_rank_raising_in_write_data_fails_every_rank(
    run_dcp: Runner, tmp_path: Path, api: str, world: int, victim: int
) -> None:
    """One rank's write fails: nothing is promoted, the staging dir is gone, and every rank
    raises: our wrappers a DistributedCommitError (the victim its own error), plain DCP its
    CheckpointException carrying the victim's error and the others' DistributedCommitError."""
    results = run_dcp("rank_raises", world, victim=victim, api=api)
    fired = tmp_path / "out0" / "fired"
    assert fired.exists()  # the fault fired
    assert TMP_INFIX in Path(fired.read_text()).name  # in the staging dir
    for r in results:
        assert r.exitcode == 0, r
        if api.startswith("wrapper"):
            expected = "OSError" if r.rank == victim else "DistributedCommitError"
            assert r.error == expected, r
            assert "disk full on purpose" in r.message
        else:
            assert r.error == "CheckpointException", r
            assert r.data[str(victim)] == "OSError"
            assert {v for k, v in r.data.items() if k != str(victim)} == {"DistributedCommitError"}
    ckpts = CheckpointDir(tmp_path / "ckpts")
    assert ckpts.steps() == []
    assert leftovers(ckpts.root) == []  # removed at once, not left for clean()


def test_a_failed_async_save_nobody_reads_is_logged_on_every_rank(
    run_dcp: Runner, tmp_path: Path
) -> None:
    """A script that never reads async_save's future still hears of the failure: an ERROR
    from atomic_ckpt.dcp on every rank, naming the step and saying nothing was committed."""
    results = run_dcp("async_failure_unread", 2, victim=1)
    assert (tmp_path / "out0" / "fired").exists()  # the fault fired
    for r in results:
        assert r.exitcode == 0, r
        assert r.data["failed"] is True
        assert any(
            "asynchronous save of step 2" in m and "not committed" in m for m in r.data["logged"]
        ), r.data
    assert CheckpointDir(tmp_path / "ckpts").steps() == []


@pytest.mark.parametrize(("world", "victim"), [(2, 1), (2, 0), (4, 3)])
def test_a_rank_killed_mid_write_fails_the_survivors_in_time(
    run_dcp: Runner, tmp_path: Path, world: int, victim: int
) -> None:
    """A rank SIGKILLed while writing its shard: every survivor raises DistributedCommitError
    within the timeouts, nothing is promoted, and clean() leaves nothing behind."""
    results = run_dcp("rank_killed", world, victim=victim, pg_timeout=PG_TIMEOUT)
    assert results[victim].exitcode == -9
    assert TMP_INFIX in (tmp_path / "out0" / "killed").read_text()  # died in the staging dir
    for r in results:
        if r.rank != victim:
            assert r.error == "DistributedCommitError", r
            assert r.elapsed < TIMEOUT + PG_TIMEOUT + SLACK
    ckpts = CheckpointDir(tmp_path / "ckpts")
    assert ckpts.steps() == []
    ckpts.clean()
    assert leftovers(ckpts.root) == []


@pytest.mark.parametrize("replace", [False, True])
def test_coordinator_killed_before_promotion_promotes_nothing(
    run_dcp: Runner, tmp_path: Path, replace: bool
) -> None:
    """Rank 0 dies with every shard written and the marker in place, before the rename:
    rank 1 raises DistributedCommitError in time, the old step (if any) is intact, and
    clean() removes the marked staging dir."""
    ckpts = CheckpointDir(tmp_path / "ckpts")
    if replace:
        with ckpts.commit(3) as path:
            (path / "old.bin").write_bytes(b"old")
    results = run_dcp("coordinator_killed_before_promotion", 2, step=3, pg_timeout=PG_TIMEOUT)
    assert results[0].exitcode == -9
    staging_name, marked = json.loads((tmp_path / "out0" / "fired").read_text())
    assert marked is True  # the fault fired after the marker was written
    assert results[1].error == "DistributedCommitError", results[1]
    assert "may have promoted step 3" in results[1].message  # rank 1 cannot know
    assert results[1].elapsed < TIMEOUT + PG_TIMEOUT + SLACK
    staging = ckpts.root / staging_name
    assert (staging / MARKER).is_file()
    assert ckpts.steps() == ([3] if replace else [])
    if replace:
        assert (ckpts.verify(3).path / "old.bin").read_bytes() == b"old"
    assert staging in ckpts.clean()
    assert leftovers(ckpts.root) == []


@pytest.mark.parametrize("on_pending", ["wait", "raise"])
def test_a_second_async_save_waits_for_or_refuses_the_pending_one(
    run_dcp: Runner, tmp_path: Path, on_pending: str
) -> None:
    """A writer made while the previous async save still runs: "wait" starts only once it
    ended (then both are committed); "raise" raises PendingSaveError on every rank."""
    results = run_dcp("pending", 2, on_pending=on_pending, slow=4.0)
    assert all(r.ok for r in results), results
    for r in results:
        assert r.data["exact"] is True
        assert r.data["first_done_at_start"] is False  # the first save was still running
        if on_pending == "wait":
            assert r.data["error"] is None
            assert r.data["first_done_before_second"] is True
            assert r.data["latest"] == 2
        else:
            assert r.data["error"] == "PendingSaveError"
            assert r.data["first_done_before_second"] is False
            assert r.data["latest"] == 1
    ckpts = CheckpointDir(tmp_path / "ckpts")
    assert ckpts.steps() == ([1, 2] if on_pending == "wait" else [1])
    assert leftovers(ckpts.root) == []
