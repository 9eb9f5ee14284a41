"""Saves rank 0 alone writes (rank0_commit), and the distributed API in a single process
(no process group): the same script runs on one process or many without branching."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import Runner
from dist_scenarios import TIMEOUT

from atomic_ckpt import CheckpointDir, RetentionPolicy, UnmarkedCheckpointsError
from atomic_ckpt.distributed import declare, distributed_commit, rank0_commit, rank_path, resume

SLACK = 20.0
RETAIN = RetentionPolicy(keep_last=1)


def test_rank0_commit_publishes_what_rank_0_wrote_before_any_rank_goes_on(
    run_ranks: Runner, tmp_path: Path
) -> None:
    """Rank 0 gets the staging dir, the others None; every rank sees the step afterwards."""
    results = run_ranks("rank0_saves", 2)
    assert all(r.ok for r in results), results
    assert results[0].data["path"] is not None
    assert results[1].data["path"] is None
    assert [r.data["steps"] for r in results] == [[4], [4]]
    ckpt = CheckpointDir(tmp_path / "ckpts").verify(4)
    assert [e.path for e in ckpt.manifest.files] == ["model.bin"]
    assert ckpt.manifest.metadata == {"by": "rank0"}


def test_a_killed_rank_0_makes_the_waiting_ranks_raise_a_distributed_commit_error(
    run_ranks: Runner, tmp_path: Path
) -> None:
    """SIGKILL of rank 0 mid-save: rank 1 raises DistributedCommitError in time, not gloo's
    own error; nothing was promoted."""
    results = run_ranks("rank0_saves", 2, die=True)
    assert results[0].exitcode == -9  # the kill fired
    assert (tmp_path / "out0" / "killed").exists()
    survivor = results[1].data
    assert survivor["error"] == "DistributedCommitError", survivor
    assert "lost contact" in survivor["message"]
    assert survivor["elapsed"] < TIMEOUT + SLACK
    assert CheckpointDir(tmp_path / "ckpts").steps() == []


def test_rank_0_s_failed_save_is_named_on_every_rank(run_ranks: Runner, tmp_path: Path) -> None:
    """Rank 0 re-raises its own error; rank 1 gets a DistributedCommitError naming it."""
    results = run_ranks("rank0_saves", 2, fail=True)
    assert results[0].data["error"] == "OSError"
    assert "no space left on purpose" in results[0].data["message"]
    assert results[1].data["error"] == "DistributedCommitError"
    assert "no space left on purpose" in results[1].data["message"]
    assert CheckpointDir(tmp_path / "ckpts").steps() == []


def test_rank0_commit_joins_an_enclosing_one_and_commits_names_and_labels(
    run_ranks: Runner, tmp_path: Path
) -> None:
    """The seed trainer's pattern on two ranks: save_checkpoint() joins the epoch commit
    (nothing published until the outer block ends), commits alone when nothing is open;
    the epoch's label and a named ``interrupted`` checkpoint are committed from rank 0."""
    results = run_ranks("rank0_saves_nested", 2)
    assert all(r.ok for r in results), results
    for r in results:
        assert r.data["joined"] is True
        assert r.data["steps"] == [5]
        assert r.data["aliases"] == ["epoch0_step5"]
        assert r.data["alone"] is True
        assert r.data["named"] == {"epoch": 1}
    ckpts = CheckpointDir(tmp_path / "ckpts")
    assert sorted(e.path for e in ckpts.verify(5).manifest.files) == [
        "model.bin",
        "trainer_state.json",
    ]
    assert ckpts.steps() == [5, 6]


# ---------------------------------------------------------------- without a process group


def test_without_a_process_group_distributed_commit_is_a_plain_commit(tmp_path: Path) -> None:
    """distributed_commit, rank_path and declare work in a single process (rank 0)."""
    ckpts = CheckpointDir(tmp_path / "ckpts")
    with distributed_commit(ckpts, 2) as path:
        rank_path(path / "shard.bin").write_bytes(b"rank zero's shard")
        (path / "config.json").write_text("{}")
        declare(path / "config.json")
    ckpt = ckpts.verify(2)
    assert sorted(e.path for e in ckpt.manifest.files) == ["config.json", "shard.rank0.bin"]


def test_without_a_process_group_rank0_commit_yields_the_path(tmp_path: Path) -> None:
    """A single process is rank 0: it gets the path, and leaving the block commits."""
    ckpts = CheckpointDir(tmp_path / "ckpts")
    with rank0_commit(ckpts, 1, metadata={"x": 1}) as path:
        assert path is not None
        (path / "model.bin").write_bytes(b"weights")
    assert ckpts.verify(1).manifest.metadata == {"x": 1}


def test_without_a_process_group_resume_is_resume_point(tmp_path: Path) -> None:
    """distributed.resume() answers like CheckpointDir.resume_point(): the newest complete
    checkpoint, None on an empty root, and the same refusal of unmarked directories."""
    ckpts = CheckpointDir(tmp_path / "ckpts")
    assert resume(ckpts) is None
    with ckpts.commit(3) as path:
        (path / "a").write_bytes(b"a")
    found = resume(ckpts, verify=True)
    assert found is not None
    assert found.step == 3
    other = CheckpointDir(tmp_path / "legacy")
    (other.root / "5").mkdir(parents=True)
    (other.root / "5" / "model.bin").write_bytes(b"legacy")
    with pytest.raises(UnmarkedCheckpointsError):
        resume(other)
    assert resume(other, fresh=True) is None


def test_without_a_process_group_rank0_commit_joins_names_and_labels(tmp_path: Path) -> None:
    """One process: join=True adds to an enclosing rank0_commit (or a plain commit) of the
    step; a name commits a named checkpoint; retain= with a name is refused."""
    ckpts = CheckpointDir(tmp_path / "ckpts")
    with rank0_commit(ckpts, 3, aliases=["epoch0_step3"]) as outer:
        with rank0_commit(ckpts, 3, join=True) as inner:
            assert inner == outer
            assert inner is not None
            (inner / "model.bin").write_bytes(b"m")
        assert ckpts.steps() == []  # the inner exit published nothing
    assert ckpts.aliases(3) == ["epoch0_step3"]
    with ckpts.commit(4) as plain, rank0_commit(ckpts, 4, join=True) as inner:
        assert inner == plain
    with rank0_commit(ckpts, "interrupted", metadata={"e": 1}) as path:
        assert path is not None
    assert ckpts.get_named("interrupted").manifest.metadata == {"e": 1}
    with pytest.raises(ValueError, match="retain"), rank0_commit(ckpts, "x", retain=RETAIN):
        pass
    assert ckpts.steps() == [3, 4]


def test_a_rank_lost_while_the_ranks_connect_is_a_distributed_commit_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gloo failing to connect the coordination group (a rank died meanwhile: what a rank 0
    killed at once looks like to rank 1) is a DistributedCommitError, not gloo's error."""
    import torch.distributed as dist

    from atomic_ckpt import DistributedCommitError
    from atomic_ckpt.distributed import _ranks

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    calls: list[object] = []

    def lost(*args: object, **kwargs: object) -> object:
        calls.append(kwargs)
        raise RuntimeError("Gloo connectFullMesh failed: Connection closed by peer (on purpose)")

    try:
        monkeypatch.setattr(_ranks.dist, "new_group", lost)
        with pytest.raises(DistributedCommitError, match="lost contact") as caught:
            _ranks._coordination_group(None, 12.345)
        assert calls  # the failure was injected where the group is made
        assert "on purpose" in str(caught.value)
    finally:
        monkeypatch.undo()
        dist.destroy_process_group()
