"""The torch helpers: any integer step, tied weights saved once, resume past a corrupt step."""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
pytest.importorskip("safetensors")

from atomic_ckpt import AsyncCommitter, CheckpointDir, InvalidStepError  # noqa: E402
from atomic_ckpt.torch import (  # noqa: E402
    MODEL_FILE,
    STATE_FILE,
    load_state,
    resume,
    save_state,
)

INTEGER_STEPS: dict[str, Callable[[int], Any]] = {
    "numpy.int64": np.int64,
    "numpy.int32": np.int32,
    "torch.tensor": torch.tensor,
}


@pytest.mark.parametrize("make", INTEGER_STEPS.values(), ids=INTEGER_STEPS.keys())
def test_save_state_accepts_any_integer_step(
    ckpts: CheckpointDir, make: Callable[[int], Any]
) -> None:
    """save_state() with a numpy or torch integer step commits it, and it loads back as an int."""
    ckpt = save_state(ckpts, make(5), model=torch.nn.Linear(2, 2))
    assert ckpt.step == 5
    assert ckpts.steps() == [5]
    assert json.loads((ckpt.path / STATE_FILE).read_text())["step"] == 5
    state = load_state(ckpt, model=torch.nn.Linear(2, 2))
    assert state.step == 5
    assert type(state.step) is int


def test_a_torch_boolean_step_is_refused(ckpts: CheckpointDir) -> None:
    """A torch bool tensor is refused as a step with InvalidStepError, like a plain bool."""
    step = torch.tensor(True)
    with pytest.raises(InvalidStepError), ckpts.commit(step) as path:
        (path / "model.bin").write_bytes(b"x")
    with pytest.raises(InvalidStepError):
        save_state(ckpts, step, model=torch.nn.Linear(2, 2))
    assert ckpts.steps() == []


def _tied_model() -> Any:
    """An embedding and an output layer sharing one weight, as in language models."""
    embed = torch.nn.Embedding(1000, 64)
    head = torch.nn.Linear(64, 1000, bias=False)
    head.weight = embed.weight
    return torch.nn.Sequential(embed, head)


def test_async_save_keeps_tied_weights_tied(ckpts: CheckpointDir, tmp_path: Path) -> None:
    """AsyncCommitter.save(step, model.state_dict()) stores tied weights once, tied on load."""
    state = _tied_model().state_dict()
    # What model.state_dict() gives: two tensor objects over one storage.
    assert state["0.weight"] is not state["1.weight"]
    assert state["0.weight"].data_ptr() == state["1.weight"].data_ptr()
    with AsyncCommitter(ckpts) as saver:
        saver.save(1, state)
    saved = ckpts.verify(1).path / "state.pt"
    loaded = torch.load(saved, weights_only=True)
    assert torch.equal(loaded["0.weight"], state["0.weight"])
    assert loaded["0.weight"].data_ptr() == loaded["1.weight"].data_ptr(), "the tie was lost"
    plain = tmp_path / "plain.pt"
    torch.save(state, plain)
    assert saved.stat().st_size <= plain.stat().st_size * 1.05, "tied weights were stored twice"


def test_resume_with_verify_falls_back_to_the_newest_intact_checkpoint(
    ckpts: CheckpointDir, caplog: pytest.LogCaptureFixture
) -> None:
    """resume(verify=True) skips a corrupt newest checkpoint, with a warning naming it."""
    model = torch.nn.Linear(4, 4)
    save_state(ckpts, 1, model=model)
    intact = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.add_(1.0)
    save_state(ckpts, 2, model=model)
    weights = ckpts.path_of(2) / MODEL_FILE
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # same size, different bytes: only the checksum notices
    weights.write_bytes(bytes(data))

    fresh = torch.nn.Linear(4, 4)
    with caplog.at_level(logging.WARNING), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state = resume(ckpts, model=fresh, verify=True)
    assert state is not None
    assert state.step == 1
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in intact.items())
    said = [r.getMessage() for r in caplog.records] + [str(w.message) for w in caught]
    assert any(str(ckpts.path_of(2)) in m or "step 2" in m for m in said), said
