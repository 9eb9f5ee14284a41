"""AsyncCommitter: background commits, one at a time, errors never silent."""

from __future__ import annotations

import functools
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from atomic_ckpt import TMP_INFIX, AsyncCommitter, CheckpointDir, RetentionPolicy
from atomic_ckpt._core.l5_facade.asynchronous import snapshot


def write_json(state: Any, directory: Path) -> None:
    (directory / "state.json").write_text(json.dumps(state))


def read_json(ckpts: CheckpointDir, step: int) -> Any:
    return json.loads((ckpts.verify(step).path / "state.json").read_text())


def leftovers(ckpts: CheckpointDir) -> list[str]:
    return [p.name for p in ckpts.root.iterdir() if TMP_INFIX in p.name and "root" not in p.name]


def test_save_returns_and_the_commit_completes_in_background(ckpts: CheckpointDir) -> None:
    """save() hands over the state; after wait() the checkpoint is complete and verified."""
    with AsyncCommitter(ckpts, writer=write_json) as saver:
        saver.save(1, {"w": [1, 2, 3]}, metadata={"loss": 0.25})
        saver.wait()
        assert saver.pending is None
    assert read_json(ckpts, 1) == {"w": [1, 2, 3]}
    assert ckpts.get(1).manifest.metadata == {"loss": 0.25}


def test_the_state_is_copied_before_save_returns(ckpts: CheckpointDir) -> None:
    """Mutating the state right after save() does not change what is committed."""
    gate = threading.Event()

    def slow_writer(state: Any, directory: Path) -> None:
        gate.wait()
        write_json(state, directory)

    state = {"w": [1, 2, 3], "nested": {"x": 1}}
    with AsyncCommitter(ckpts, writer=slow_writer) as saver:
        saver.save(1, state)
        state["w"].append(4)
        state["nested"]["x"] = 2
        gate.set()
    assert read_json(ckpts, 1) == {"w": [1, 2, 3], "nested": {"x": 1}}


def test_at_most_one_commit_is_in_flight(ckpts: CheckpointDir) -> None:
    """The next save() waits for the commit in flight (back-pressure): no overlap."""
    second_started = threading.Event()
    seen_overlap: list[bool] = []

    def writer(state: Any, directory: Path) -> None:
        if state == 1:
            # Give save(2) every chance to start its writer while we are in flight.
            second_started.wait(1.0)
            seen_overlap.append(second_started.is_set())
        else:
            second_started.set()
        write_json(state, directory)

    saver = AsyncCommitter(ckpts, writer=writer)
    saver.save(1, 1)
    saver.save(2, 2)  # returns only once step 1 is committed
    assert ckpts.steps() == [1]
    saver.close()
    assert seen_overlap == [False]
    assert ckpts.steps() == [1, 2]


def test_an_error_surfaces_at_the_next_save(ckpts: CheckpointDir) -> None:
    """A failed background commit raises at the next save(), which starts nothing."""
    fired: list[int] = []

    def failing(directory: Path) -> None:
        fired.append(1)
        raise OSError(28, "No space left on device")

    saver = AsyncCommitter(ckpts, writer=write_json)
    saver.save(1, failing)
    with pytest.raises(OSError, match="No space left") as info:
        saver.save(2, {"a": 1})
    assert fired == [1]
    assert any("background commit of step 1" in n for n in info.value.__notes__)
    assert ckpts.steps() == []
    assert leftovers(ckpts) == []  # the failed commit removed its staging dir
    saver.save(2, {"a": 1})  # the error was raised once; the committer goes on
    saver.close()
    assert ckpts.steps() == [2]


def test_an_error_surfaces_at_wait(ckpts: CheckpointDir) -> None:
    """wait() raises the error of the commit in flight."""
    saver = AsyncCommitter(ckpts)
    saver.save(1, functools.partial(_raise, ValueError("bad state")))
    with pytest.raises(ValueError, match="bad state"):
        saver.wait()
    saver.close()  # raised once, not again


def test_an_error_surfaces_at_close_and_exit(ckpts: CheckpointDir) -> None:
    """Leaving the with block raises the background error."""
    with pytest.raises(ValueError, match="bad state"), AsyncCommitter(ckpts) as saver:
        saver.save(1, functools.partial(_raise, ValueError("bad state")))
    assert ckpts.steps() == []


def test_a_block_error_is_kept_and_the_commit_error_attached(ckpts: CheckpointDir) -> None:
    """When the block and the commit both fail, the block's error propagates with a note."""

    def training() -> None:
        with AsyncCommitter(ckpts) as saver:
            saver.save(1, functools.partial(_raise, ValueError("bad state")))
            raise KeyError("training failed")

    with pytest.raises(KeyError) as info:
        training()
    assert any("bad state" in n for n in info.value.__notes__)


def test_closed_committer_refuses_saves(ckpts: CheckpointDir) -> None:
    """save() after close() is an error."""
    saver = AsyncCommitter(ckpts, writer=write_json)
    saver.close()
    with pytest.raises(RuntimeError, match="closed"):
        saver.save(1, {})


def test_invalid_step_and_metadata_fail_in_the_callers_thread(ckpts: CheckpointDir) -> None:
    """Bad arguments raise at once, not later from the background."""
    saver = AsyncCommitter(ckpts, writer=write_json)
    with pytest.raises(ValueError, match="non-negative"):
        saver.save(-1, {})
    with pytest.raises(ValueError, match="JSON"):
        saver.save(1, {}, metadata={"x": object()})
    with pytest.raises(TypeError, match="state_dict"):
        saver.save(1, _HasStateDict())
    saver.close()
    assert ckpts.steps() == []


def test_a_crash_mid_commit_is_like_a_synchronous_one(ckpts: CheckpointDir) -> None:
    """An interrupted background commit leaves the old checkpoints and nothing else."""
    with AsyncCommitter(ckpts, writer=write_json) as saver:
        saver.save(1, {"v": 1})
    fired: list[int] = []

    def interrupted(directory: Path) -> None:
        (directory / "half").write_bytes(b"x" * 10)
        fired.append(1)
        raise KeyboardInterrupt  # a BaseException, as an abort would be

    saver = AsyncCommitter(ckpts)
    saver.save(1, interrupted)
    with pytest.raises(KeyboardInterrupt):
        saver.close()
    assert fired == [1]
    assert read_json(ckpts, 1) == {"v": 1}
    assert leftovers(ckpts) == []


def test_retention_is_applied_after_each_commit(ckpts: CheckpointDir) -> None:
    """retain= runs in the background after each commit is durable."""
    with AsyncCommitter(ckpts, writer=write_json, retain=RetentionPolicy(keep_last=2)) as s:
        for step in range(1, 6):
            s.save(step, {"step": step})
    assert ckpts.steps() == [4, 5]


def test_snapshot_copies_tensors_to_cpu_and_keeps_sharing() -> None:
    """snapshot(): tensors are detached copies; a tensor shared twice stays shared."""
    torch = pytest.importorskip("torch")
    w = torch.ones(3, requires_grad=True)
    state = {"a": w, "b": w, "t": (w, 1), "l": [{"x": w}]}
    copied = snapshot(state)
    with torch.no_grad():
        w.add_(1)
    assert torch.equal(copied["a"], torch.ones(3))
    assert copied["a"] is copied["b"] is copied["t"][0] is copied["l"][0]["x"]
    assert not copied["a"].requires_grad


def test_default_writer_saves_with_torch(ckpts: CheckpointDir) -> None:
    """Without a writer, a state is written with torch.save to state.pt."""
    torch = pytest.importorskip("torch")
    with AsyncCommitter(ckpts) as saver:
        saver.save(3, {"w": torch.arange(4)})
    loaded = torch.load(ckpts.verify(3).path / "state.pt", weights_only=True)
    assert torch.equal(loaded["w"], torch.arange(4))


class _HasStateDict:
    def state_dict(self) -> dict[str, Any]:
        return {}


def _raise(exc: BaseException, _directory: Path) -> None:
    raise exc
