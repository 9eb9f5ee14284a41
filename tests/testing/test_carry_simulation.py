"""Power-loss simulation of a carrying commit: every crash state keeps the old or the new
checkpoint whole, and removing the source afterwards loses nothing."""

from __future__ import annotations

from crash_stats import CrashStats

from atomic_ckpt import CheckpointDir
from atomic_ckpt.testing import CrashState, check_invariants, explore, mutant, record

FROZEN = bytes(range(256)) * 8
FILES = {"frozen.bin": FROZEN, "tokenizer/sub/merges.txt": b"a b\n", "tokenizer/v.json": b"{}"}


def _setup(ckpts: CheckpointDir) -> None:
    with ckpts.commit(1) as path:
        for rel, data in FILES.items():
            (path / rel).parent.mkdir(parents=True, exist_ok=True)
            (path / rel).write_bytes(data)
        (path / "trainable.bin").write_bytes(b"step 1")


def _carrying_save(ckpts: CheckpointDir) -> None:
    with ckpts.begin(2) as commit:
        commit.carry("frozen.bin", from_=1)
        commit.carry("tokenizer/", from_=1)
        (commit.path / "trainable.bin").write_bytes(b"step 2")
    ckpts.prune(keep_last=1)  # the source goes; the carrier must keep every byte


def _loads(state: CrashState) -> None:
    """Every complete checkpoint holds the frozen files whole, whoever else is gone."""
    check_invariants(state)
    for ckpt in state.checkpoints().checkpoints():
        for rel, data in FILES.items():
            assert (ckpt.path / rel).read_bytes() == data, f"{ckpt.path / rel} damaged"


def test_every_crash_state_of_a_carrying_commit_keeps_the_invariants(
    crash_stats: CrashStats,
) -> None:
    """Kill and power loss at every point of carry, publish and prune: 0 violations."""
    report = explore(_carrying_save, _loads, setup=_setup, samples=16)
    crash_stats.add(report)
    assert report.states_checked > 20
    assert set(report.checked_by_model) == {"strict", "ext4", "subset"}
    assert report.ok, str(report)


def test_the_recording_carries_by_hard_link() -> None:
    """The simulated tree really shares the inodes (the exploration above tests links)."""
    with record(_carrying_save, setup=_setup) as rec:
        links = [op.description for op in rec.ops if op.description.startswith("link ")]
    assert any(d.endswith("/frozen.bin") for d in links), links
    assert any(d.endswith("tokenizer/sub/merges.txt") for d in links), links


def test_without_the_subdirectory_fsync_a_carried_link_can_be_lost() -> None:
    """The fsync that makes a carried hard link durable matters: without it a crash state
    shows a complete checkpoint missing a carried file."""
    report = explore(_carrying_save, _loads, setup=_setup, sync=mutant("subdir"), samples=16)
    assert not report.ok
    assert report.failure is not None
    assert "merges.txt" in str(report)
