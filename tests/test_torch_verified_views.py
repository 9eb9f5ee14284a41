"""A verified load reads only the bytes it verified (issue 30 item 3): load_state given a
VerifiedCheckpoint, and resume(verify=True), take optimizer.pt and scheduler.pt from the
hashed views, never by reopening the path after the step was committed again."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from atomic_ckpt import CheckpointDir, VerifiedCheckpoint  # noqa: E402
from atomic_ckpt.torch import (  # noqa: E402
    MODEL_FILE,
    OPTIMIZER_FILE,
    STATE_FILES,
    load_state,
    resume,
    save_state,
)


def _objects(lr: float) -> tuple[Any, Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=lr)
    return model, opt, sched


def _save(ckpts: CheckpointDir, step: int, lr: float) -> None:
    model, opt, sched = _objects(lr)
    save_state(ckpts, step, model=model, optimizer=opt, scheduler=sched)


def test_load_state_of_a_verified_checkpoint_reads_the_pickles_from_the_hashed_views(
    ckpts: CheckpointDir,
) -> None:
    """Step 1 is committed again between resume_verified and load_state: the optimizer and
    scheduler still come from the save that was verified, like the model."""
    _save(ckpts, 1, lr=0.1)
    verified = ckpts.resume_verified(STATE_FILES)
    assert verified is not None
    _save(ckpts, 1, lr=0.5)  # the step now holds a save nobody verified
    assert OPTIMIZER_FILE in verified.files
    model, opt, sched = _objects(lr=0.9)
    load_state(verified, model=model, optimizer=opt, scheduler=sched)
    assert opt.param_groups[0]["lr"] == 0.1
    assert sched.gamma == 0.1


def test_a_verified_checkpoint_without_the_view_a_load_needs_is_refused(
    ckpts: CheckpointDir,
) -> None:
    """A VerifiedCheckpoint that kept only the model cannot load the optimizer verified: a
    ValueError naming the file and resume_verified, not a read of the unverified path."""
    _save(ckpts, 1, lr=0.1)
    verified = ckpts.resume_verified([MODEL_FILE])
    assert verified is not None
    model, opt, _ = _objects(lr=0.9)
    with pytest.raises(ValueError, match=OPTIMIZER_FILE):
        load_state(verified, model=model, optimizer=opt)


def test_resume_verify_reads_the_verified_bytes_when_it_falls_back_to_an_older_step(
    ckpts: CheckpointDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The newest step does not verify, so resume(verify=True) loads the older one (its
    early pickles shortcut not taken); that step is re-committed right after it verified:
    the optimizer still comes from the bytes that verified."""
    _save(ckpts, 1, lr=0.1)
    _save(ckpts, 2, lr=0.2)
    damaged = ckpts.path_of(2) / MODEL_FILE
    damaged.write_bytes(b"x" * damaged.stat().st_size)  # same size, other bytes
    real = CheckpointDir.resume_verified
    fired = []

    def then_recommit(self: CheckpointDir, *a: Any, **k: Any) -> VerifiedCheckpoint | None:
        found = real(self, *a, **k)
        assert found is not None
        assert found.checkpoint.step == 1
        _save(ckpts, 1, lr=0.5)
        fired.append(True)
        return found

    monkeypatch.setattr(CheckpointDir, "resume_verified", then_recommit)
    model, opt, sched = _objects(lr=0.9)
    state = resume(ckpts, model=model, optimizer=opt, scheduler=sched, verify=True)
    assert fired == [True]
    assert state is not None
    assert state.step == 1
    assert opt.param_groups[0]["lr"] == 0.1
    assert sched.gamma == 0.1
