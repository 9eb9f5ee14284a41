"""Power-loss simulation of a deduplicating commit: every crash state keeps the old or the
new checkpoint whole, and removing the source afterwards loses nothing."""

from __future__ import annotations

from pathlib import Path

from crash_stats import CrashStats

from atomic_ckpt import CheckpointDir
from atomic_ckpt.testing import CrashState, check_invariants, explore, record

FILES = {"shard.bin": bytes(range(256)) * 8, "tok/sub/merges.txt": b"a b\n", "tok/v.json": b"{}"}


def _write(base: Path, trainable: bytes) -> None:
    for rel, data in FILES.items():
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_bytes(data)
    (base / "trainable.bin").write_bytes(trainable)


def _setup(ckpts: CheckpointDir) -> None:
    with ckpts.commit(1) as path:
        _write(path, b"step 1")


def _deduping_save(ckpts: CheckpointDir) -> None:
    with ckpts.commit(2, dedup=True) as path:  # the writer writes everything again
        _write(path, b"step 2")
    ckpts.prune(keep_last=1)  # the source goes; the deduplicated files must stay whole


def _loads(state: CrashState) -> None:
    """Every complete checkpoint holds the shared files whole, whoever else is gone."""
    check_invariants(state)
    for ckpt in state.checkpoints().checkpoints():
        for rel, data in FILES.items():
            assert (ckpt.path / rel).read_bytes() == data, f"{ckpt.path / rel} damaged"


def test_every_crash_state_of_a_deduplicating_commit_keeps_the_invariants(
    crash_stats: CrashStats,
) -> None:
    """Kill and power loss at every point of the publish (links included) and the prune."""
    report = explore(_deduping_save, _loads, setup=_setup, samples=16)
    crash_stats.add(report)
    assert report.states_checked > 20
    assert report.ok, str(report)


def test_the_recording_deduplicates_by_hard_link() -> None:
    """The simulated tree really shares the inodes: the exploration above tests links."""
    with record(_deduping_save, setup=_setup) as rec:
        ops = [op.description for op in rec.ops]
    links = [d for d in ops if d.startswith("link ")]
    assert any("shard.bin" in d for d in links), ops
    assert any("merges.txt" in d for d in links), ops
    assert any(d.startswith("fsync") and d.endswith("/tok/sub") for d in ops), ops
