"""``save_on_each_node=True`` with 2 CPU processes (gloo): refused only when the processes
are on several nodes (node-local disks rank 0 cannot commit), accepted on one node."""

from __future__ import annotations

from pathlib import Path

from hf_launch import complete_steps, launch


def test_save_on_each_node_on_one_node_with_two_processes_commits(tmp_path: Path) -> None:
    """One node, 2 processes, save_on_each_node=True: the node's disk is every rank's
    disk, so the run trains and commits its checkpoints as without the option."""
    out = tmp_path / "out"
    cfg = {"out": str(out), "steps": 2, "save_steps": 1, "limit": 1, "save_on_each_node": True}
    run = launch(cfg, world=2, tmp=tmp_path)
    assert run.ok, run.logs
    assert complete_steps(out) == [2]
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= {
        p.name for p in (out / "checkpoint-2").iterdir()
    }


def test_save_on_each_node_across_two_nodes_is_refused_naming_the_nodes(tmp_path: Path) -> None:
    """2 processes posing as 2 nodes (LOCAL_WORLD_SIZE=1): refused on every rank before
    training, with a message that says why and what to do; nothing is written."""
    out = tmp_path / "out"
    cfg = {"out": str(out), "steps": 2, "save_steps": 1, "save_on_each_node": True}
    run = launch(cfg, world=2, tmp=tmp_path, per_node=1)
    assert all(code not in (0, None) for code in run.codes), run.codes
    for log in run.logs:
        assert "save_on_each_node=True on several nodes (2 processes, 1 per node)" in log, log
        assert "filesystem every rank shares" in log
    assert complete_steps(out) == []
