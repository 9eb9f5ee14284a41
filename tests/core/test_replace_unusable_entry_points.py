"""Every commit entry point that can replace a step takes ``replace_unusable`` (issue 30
item 6): over a complete checkpoint moved to the step's name by hand (``mv interrupted
5``) each refuses by default (StepConflictError naming the option, the moved checkpoint
kept) and replaces it when told. The multi-rank forms: tests/distributed."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from atomic_ckpt import AsyncCommitter, CheckpointDir, StepConflictError


def _moved_interrupt(ckpts: CheckpointDir, step: int) -> None:
    with ckpts.commit_named("interrupted") as path:
        (path / "model.pt").write_bytes(b"interrupt save")
    os.rename(ckpts.root / "interrupted", ckpts.path_of(step))


def _write(path: Path) -> None:
    (path / "model.pt").write_bytes(b"new")


def _async(ckpts: CheckpointDir, replace: bool) -> None:
    with AsyncCommitter(ckpts) as saver:
        saver.save(5, _write, replace_unusable=replace)


def _distributed(ckpts: CheckpointDir, replace: bool) -> None:
    pytest.importorskip("torch.distributed")
    from atomic_ckpt.distributed import distributed_commit

    with distributed_commit(ckpts, 5, replace_unusable=replace) as path:
        _write(path)


def _rank0(ckpts: CheckpointDir, replace: bool) -> None:
    pytest.importorskip("torch.distributed")
    from atomic_ckpt.distributed import rank0_commit

    with rank0_commit(ckpts, "5", replace_unusable=replace) as path:
        assert path is not None
        _write(path)


def _save_state(ckpts: CheckpointDir, replace: bool) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    from atomic_ckpt.torch import save_state

    save_state(ckpts, 5, model=torch.nn.Linear(2, 2), replace_unusable=replace)


def _dcp(ckpts: CheckpointDir, replace: bool) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch.distributed.checkpoint")
    from atomic_ckpt import dcp

    dcp.save({"w": torch.ones(3)}, ckpts, 5, replace_unusable=replace)


def _promote(ckpts: CheckpointDir, replace: bool) -> None:
    with ckpts.commit_named("best-run") as path:
        _write(path)
    try:
        ckpts.promote_named("best-run", 5, replace_unusable=replace)
    except StepConflictError:
        ckpts.delete("best-run")
        raise


def _accelerate(ckpts: CheckpointDir, replace: bool) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("accelerate")
    from accelerate import Accelerator

    from atomic_ckpt.integrations.accelerate import save_state

    # It took no replace_unusable: the refusal named an option that went on, through
    # **kwargs, to Accelerator.save_state (a TypeError).
    save_state(Accelerator(cpu=True), ckpts, 5, replace_unusable=replace)


def _mirror(ckpts: CheckpointDir, replace: bool) -> None:
    import uuid

    from atomic_ckpt.remote import Mirror, RemoteCheckpointDir

    remote = RemoteCheckpointDir(
        f"memory://atomic-{uuid.uuid4().hex}", staging_dir=ckpts.root.parent / "mirror"
    )
    with Mirror(ckpts, remote) as mirror, mirror.commit(5, replace_unusable=replace) as path:
        _write(path)
    assert remote.steps() == [5]


ENTRY_POINTS: dict[str, Callable[[CheckpointDir, bool], None]] = {
    "accelerate.save_state": _accelerate,
    "Mirror.commit": _mirror,
    "AsyncCommitter.save": _async,
    "distributed_commit": _distributed,
    "rank0_commit": _rank0,
    "torch.save_state": _save_state,
    "dcp.save": _dcp,
    "promote_named": _promote,
}


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_each_entry_point_refuses_a_moved_checkpoint_unless_told(
    name: str, ckpts: CheckpointDir
) -> None:
    entry = ENTRY_POINTS[name]
    _moved_interrupt(ckpts, 5)
    with pytest.raises(StepConflictError, match="replace_unusable=True"):
        entry(ckpts, False)
    kept = ckpts.path_of(5) / "model.pt"
    assert kept.read_bytes() == b"interrupt save"  # not replaced
    entry(ckpts, True)
    assert ckpts.steps() == [5]
    assert ckpts.verify(5).manifest.step == 5
    assert not kept.exists() or kept.read_bytes() != b"interrupt save"
