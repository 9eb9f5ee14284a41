"""The power-loss simulation over a single-process DCP save through AtomicWriter: every
crash state of DCP's own writes (shards, .metadata and its rename) and of the commit."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.checkpoint")

from atomic_ckpt.testing import explore, mutant  # noqa: E402
from atomic_ckpt.testing.dcp import dcp_saver, loads_exactly  # noqa: E402


def state(seed: int) -> dict[str, object]:
    gen = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(16, 4, generator=gen), "b": torch.arange(5) * seed}


def test_every_crash_state_of_a_dcp_save_is_old_or_new_and_loads() -> None:
    """A DCP save of a new step: every crash state passes the invariants, and every
    checkpoint the scanner calls complete loads with plain dcp.load as the saved state."""
    first = state(1)
    report = explore(dcp_saver(first, step=1), loads_exactly([first]))
    assert report.ok, report
    assert report.states_checked > 10  # states were actually explored
    # DCP's own writes were recorded (as a save function's), and fsynced by the writer.
    assert any(
        op.by == "observed" and op.kind == "data" and ".distcp" in op.description
        for op in report.ops
    )
    assert any(op.kind == "sync" and op.description.endswith("/.metadata") for op in report.ops)


@pytest.mark.parametrize("replace", ["exchange", "aside"])
def test_every_crash_state_of_a_dcp_resave_is_old_or_new(replace: str) -> None:
    """Re-saving an existing step through DCP: never a mix of the two saves, never neither."""
    old, new = state(1), state(2)
    report = explore(
        dcp_saver(new, step=1),
        loads_exactly([old, new]),
        setup=dcp_saver(old, step=1),
        replace=replace,  # type: ignore[arg-type]
    )
    assert report.ok, report
    assert report.states_checked > 10


@pytest.mark.parametrize("step", ["file", "staging", "root"])
def test_the_simulation_notices_a_missing_fsync_in_a_dcp_save(step: str) -> None:
    """With one durability step switched off, some crash state of the DCP save fails: the
    simulation tests the protocol around DCP's writes, not nothing."""
    old, new = state(1), state(2)
    report = explore(
        dcp_saver(new, step=1),
        loads_exactly([old, new]),
        setup=dcp_saver(old, step=1),
        sync=mutant(step),
    )
    assert not report.ok


def test_a_complete_checkpoint_that_does_not_load_is_a_reported_failure() -> None:
    """loads_exactly reports a complete checkpoint that plain dcp.load refuses (DCP raises a
    CheckpointException, a BaseException) as a crash-state failure, not an escaped error."""
    saved = state(1)
    expected = {**saved, "missing": torch.zeros(3)}  # a key the save never wrote
    report = explore(dcp_saver(saved, step=1), loads_exactly([expected]))
    assert not report.ok
    assert report.failure is not None
    assert "does not load" in report.failure.message
