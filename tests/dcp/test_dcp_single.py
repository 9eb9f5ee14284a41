"""AtomicWriter in one process (torch.distributed not needed): saves, async saves, and the
uses it refuses."""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from atomic_ckpt import CheckpointDir  # noqa: E402
from atomic_ckpt.dcp import AtomicWriter  # noqa: E402


@pytest.fixture(autouse=True)
def _quiet() -> None:
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")


def state(seed: int) -> dict[str, object]:
    return {"w": torch.randn(8, 4, generator=torch.Generator().manual_seed(seed)), "n": seed}


def loads(path: Path, seed: int) -> bool:
    target = {"w": torch.zeros(8, 4), "n": 0}
    dcp.load(target, checkpoint_id=path, no_dist=True)
    expected = state(seed)
    return torch.equal(target["w"], expected["w"]) and target["n"] == seed


def test_save_and_async_save_in_one_process(ckpts: CheckpointDir) -> None:
    """Without a process group: dcp.save and dcp.async_save through AtomicWriter commit
    verified checkpoints that plain dcp.load reads back exactly."""
    dcp.save(state(1), storage_writer=AtomicWriter(ckpts, 1), no_dist=True)
    future = dcp.async_save(state(2), storage_writer=AtomicWriter(ckpts, 2), no_dist=True)
    future.result()
    assert ckpts.steps() == [1, 2]
    for step in (1, 2):
        ckpt = ckpts.verify(step)
        assert loads(ckpt.path, step)
        assert {".metadata", "__0_0.distcp"} <= {e.path for e in ckpt.manifest.files}


def test_use_collectives_false_is_refused(ckpts: CheckpointDir) -> None:
    """Without collectives there is no coordinator to commit: refused, nothing left behind."""
    with pytest.raises(ValueError, match="use_collectives=True"):
        dcp.save(
            state(1), storage_writer=AtomicWriter(ckpts, 1), no_dist=True, use_collectives=False
        )
    assert ckpts.steps() == []
    assert not ckpts.root.exists() or not [p for p in ckpts.root.iterdir() if "lock" not in p.name]


def test_another_checkpoint_id_is_refused(ckpts: CheckpointDir, tmp_path: Path) -> None:
    """The writer commits to its own step's directory: a different checkpoint_id is an error."""
    with pytest.raises(ValueError, match="do not pass checkpoint_id"):
        dcp.save(
            state(1),
            storage_writer=AtomicWriter(ckpts, 1),
            checkpoint_id=tmp_path / "elsewhere",
            no_dist=True,
        )


def test_the_process_executor_is_refused_by_pickling(ckpts: CheckpointDir) -> None:
    """AsyncCheckpointerType.PROCESS sends the writer to a subprocess by pickling it: the writer
    refuses, with a message saying to use the thread executor."""
    with pytest.raises(TypeError, match="thread executor"):
        pickle.dumps(AtomicWriter(ckpts, 1))


def test_a_bad_on_pending_is_refused(ckpts: CheckpointDir) -> None:
    """on_pending is "wait" or "raise"."""
    with pytest.raises(ValueError, match="on_pending"):
        AtomicWriter(ckpts, 1, on_pending="skip")  # type: ignore[arg-type]
