"""The torch helpers: a training state round-trips bit-exactly inside one commit."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from atomic_ckpt import CheckpointDir  # noqa: E402
from atomic_ckpt.torch import (  # noqa: E402
    MODEL_FILE,
    OPTIMIZER_FILE,
    SCHEDULER_FILE,
    STATE_FILE,
    load_state,
    resume,
    save_state,
)


class TiedLM(torch.nn.Module):
    """A tiny language model with tied input/output weights and a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(50, 8)
        self.norm = torch.nn.BatchNorm1d(8)
        self.head = torch.nn.Linear(8, 50, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, x):
        return self.head(self.norm(self.embed(x)))


def _trained(seed: int, steps: int = 3):
    torch.manual_seed(seed)
    model = TiedLM()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    for i in range(steps):
        x = torch.randint(0, 50, (16,), generator=torch.Generator().manual_seed(i))
        loss = torch.nn.functional.cross_entropy(model(x), x)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    return model, opt, sched


def _assert_same_tree(a: object, b: object) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        assert a.dtype == b.dtype
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict)
        assert a.keys() == b.keys()
        for k in a:
            _assert_same_tree(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple)
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same_tree(x, y)
    else:
        assert a == b


def test_round_trip_is_bit_exact(ckpts: CheckpointDir) -> None:
    """Model (tied weights, buffers), Adam state and scheduler come back bit-exactly."""
    model, opt, sched = _trained(0)
    ckpt = save_state(ckpts, 3, model=model, optimizer=opt, scheduler=sched, epoch=1)
    assert {f.path for f in ckpt.manifest.files} == {
        MODEL_FILE,
        OPTIMIZER_FILE,
        SCHEDULER_FILE,
        STATE_FILE,
    }
    model2, opt2, sched2 = _trained(1, steps=1)
    state = load_state(ckpt, model=model2, optimizer=opt2, scheduler=sched2)
    assert state.step == 3
    assert state.epoch == 1
    _assert_same_tree(model.state_dict(), model2.state_dict())
    _assert_same_tree(opt.state_dict(), opt2.state_dict())
    _assert_same_tree(sched.state_dict(), sched2.state_dict())
    assert model2.head.weight is model2.embed.weight  # still tied


def test_training_continues_identically_after_resume(ckpts: CheckpointDir) -> None:
    """Resuming and training on gives the same weights as never stopping."""
    model, opt, sched = _trained(0, steps=2)
    save_state(ckpts, 2, model=model, optimizer=opt, scheduler=sched)
    reference, _, _ = _trained(0, steps=4)
    model2, opt2, sched2 = _trained(5, steps=1)
    state = resume(ckpts, model=model2, optimizer=opt2, scheduler=sched2, verify=True)
    assert state is not None
    assert state.step == 2
    for i in range(2, 4):
        x = torch.randint(0, 50, (16,), generator=torch.Generator().manual_seed(i))
        loss = torch.nn.functional.cross_entropy(model2(x), x)
        opt2.zero_grad()
        loss.backward()
        opt2.step()
        sched2.step()
    _assert_same_tree(reference.state_dict(), model2.state_dict())


def test_training_state_json_records_step_epoch_and_metadata(ckpts: CheckpointDir) -> None:
    """training_state.json holds the step, the epoch and the user's metadata."""
    model, _, _ = _trained(0, steps=0)
    ckpt = save_state(ckpts, 7, model=model, epoch=2, metadata={"loss": 1.5, "run": "a"})
    doc = json.loads((ckpt.path / STATE_FILE).read_text())
    assert doc == {"step": 7, "epoch": 2, "metadata": {"loss": 1.5, "run": "a"}}
    assert ckpt.manifest.metadata == {"loss": 1.5, "run": "a"}


def test_resume_returns_none_without_checkpoints(ckpts: CheckpointDir) -> None:
    """resume() on an empty root returns None and creates nothing."""
    model, _, _ = _trained(0, steps=0)
    assert resume(ckpts, model=model) is None
    assert not ckpts.root.exists()


def test_resume_skips_a_newer_incomplete_dir(ckpts: CheckpointDir) -> None:
    """A newer directory without a marker (a crashed naive save) is skipped by resume()."""
    model, opt, _ = _trained(0, steps=1)
    save_state(ckpts, 1, model=model, optimizer=opt)
    broken = ckpts.root / "2"
    broken.mkdir()
    (broken / MODEL_FILE).write_bytes(b"\0" * 10)  # truncated garbage
    model2, opt2, _ = _trained(3, steps=0)
    state = resume(ckpts, model=model2, optimizer=opt2)
    assert state is not None
    assert state.step == 1
    _assert_same_tree(model.state_dict(), model2.state_dict())


class _Evil:
    def __reduce__(self):
        return (print, ("pwned",))


def test_pickled_state_is_loaded_weights_only(ckpts: CheckpointDir) -> None:
    """An optimizer file holding arbitrary pickle is refused, never executed."""
    model, opt, _ = _trained(0, steps=1)
    ckpt = save_state(ckpts, 1, model=model, optimizer=opt)
    (ckpt.path / OPTIMIZER_FILE).unlink()
    torch.save({"state": _Evil()}, ckpt.path / OPTIMIZER_FILE)
    with pytest.raises(pickle.UnpicklingError):
        load_state(ckpt, model=model, optimizer=opt)


def test_importing_atomic_ckpt_does_not_import_torch() -> None:
    """`import atomic_ckpt` (and its CLI) never pulls in torch."""
    code = "import sys, atomic_ckpt, atomic_ckpt.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_missing_file_for_a_requested_object_is_an_error(ckpts: CheckpointDir) -> None:
    """Loading an optimizer from a checkpoint saved without one raises FileNotFoundError."""
    model, opt, _ = _trained(0, steps=1)
    ckpt = save_state(ckpts, 1, model=model)
    with pytest.raises(FileNotFoundError):
        load_state(ckpt, model=model, optimizer=opt)
    assert isinstance(Path(ckpt.path), Path)
