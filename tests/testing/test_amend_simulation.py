"""Power-loss simulation of ``CheckpointDir.amend``: I1-I4 hold at every crash point.

An amend replaces a step like a commit, but carries the committed files over
as hard links whose manifest entries are reused (never fsynced again), and a
metadata-only amend rewrites the marker in place. The simulator models hard
links (a new name for a known inode, with no new data), so a crash state shows
exactly what a power loss could leave of the links and the new marker.
"""

from __future__ import annotations

import pytest

from atomic_ckpt import CheckpointDir
from atomic_ckpt.testing import MODELS, explore, mutant, record


def _setup(ckpts: CheckpointDir) -> None:
    with ckpts.commit(1, metadata={"epoch": 0}) as path:
        (path / "model.bin").write_bytes(b"M" * 64)
        (path / "shards").mkdir()
        (path / "shards" / "a.bin").write_bytes(b"A" * 32)
        (path / "old.json").write_text("{}")


def _amend_files(ckpts: CheckpointDir) -> None:
    with ckpts.amend(1, metadata={"val_loss": 0.5}, remove=["old.json"]) as path:
        (path / "val_metrics.json").write_text('{"loss": 0.5}')


def _amend_metadata(ckpts: CheckpointDir) -> None:
    with ckpts.amend(1, metadata={"best": True}):
        pass


@pytest.mark.parametrize("save", [_amend_files, _amend_metadata], ids=["files", "metadata"])
@pytest.mark.parametrize("prefix", ["", "checkpoint-"], ids=["plain", "prefixed"])
def test_every_crash_state_of_an_amend_keeps_the_invariants(save: object, prefix: str) -> None:
    """Under every crash model, a crash anywhere in an amend leaves the old or the new step
    (in a plain root and in a prefixed one: both staging forms)."""
    report = explore(save, setup=_setup, prefix=prefix, models=MODELS)  # type: ignore[arg-type]
    assert report.states_checked > 10
    assert report.ok, str(report)


def test_the_amend_is_recorded_as_links_not_new_data() -> None:
    """The carried-over files appear as hard links (no data written), so the simulation
    really exercises reused, never re-fsynced entries."""
    with record(_amend_files, setup=_setup) as rec:
        links = [op for op in rec.ops if op.description.startswith("link ")]
        writes = [op for op in rec.ops if op.kind == "data"]
    assert {op.description.rsplit("/", 1)[-1] for op in links} == {"model.bin", "a.bin"}
    assert all("model.bin" not in op.description for op in writes)


def test_an_amend_without_the_subdirectory_fsync_is_caught() -> None:
    """Switching off the subdirectory fsync loses a carried link in some crash state (I1)."""
    report = explore(_amend_files, setup=_setup, sync=mutant("subdir"), models=("subset",))
    assert report.failure is not None, str(report)
    assert report.failure.invariant in ("I1", "I2"), str(report.failure)
