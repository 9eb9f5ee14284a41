"""SIGKILL a real ``AtomicTrainer`` (tiny GPT-2, CPU) mid-save, restart it, and check that it
resumes from the newest complete checkpoint and ends bit-identical to a run never killed."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from hf_launch import Run, complete_steps, launch
from packaging.version import Version

from atomic_ckpt import TMP_INFIX

pytestmark = pytest.mark.slow  # the slow tier (docs/contributing.md): python -m pytest -m slow

STEPS, SAVE_STEPS, LIMIT = 8, 2, 2


def base(out: Path, **extra: Any) -> dict[str, Any]:
    return {"out": str(out), "steps": STEPS, "save_steps": SAVE_STEPS, "limit": LIMIT, **extra}


def killed(run: Run, tmp: Path, point: str, rank: int = 0) -> None:
    """The kill fired where it was meant to: the marker is there and the exit was SIGKILL."""
    marker = tmp / f"killed-{point}-rank{rank}"
    assert marker.exists(), f"the {point} kill did not fire:\n{run.logs[rank]}"
    marker.unlink()
    assert run.codes[rank] == -9, run.logs[rank]


def same_training(ref: Path, out: Path) -> None:
    """The last checkpoints hold the same bytes of model, and the same optimizer tensors
    and loss history: the run that was killed trained exactly as the one that was not."""
    a, b = ref / f"checkpoint-{STEPS}", out / f"checkpoint-{STEPS}"
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    oa = torch.load(a / "optimizer.pt", weights_only=True)
    ob = torch.load(b / "optimizer.pt", weights_only=True)
    for key, state in oa["state"].items():
        for name, value in state.items():
            assert torch.equal(value, ob["state"][key][name]), (key, name)

    def losses(d: Path) -> list[float]:
        history = json.loads((d / "trainer_state.json").read_text())["log_history"]
        return [h["loss"] for h in history if "loss" in h]

    assert losses(a) == losses(b)
    assert len(losses(a)) == STEPS


def at_rest(out: Path) -> list[str]:
    """What the output directory holds besides the complete checkpoints."""
    done = {f"checkpoint-{s}" for s in complete_steps(out)}
    return sorted(set(os.listdir(out)) - done)


def test_trainer_killed_at_each_point_of_a_save_resumes_bit_identical(tmp_path: Path) -> None:
    """Killed inside the model write, between model and optimizer, just before the
    promotion and during rotation, each restart resumes from the newest complete
    checkpoint; rotation never leaves fewer than save_total_limit; the result is
    bit-identical to an uninterrupted run."""
    from transformers.trainer_utils import get_last_checkpoint

    from atomic_ckpt.integrations.transformers import last_checkpoint

    ref, out = tmp_path / "ref", tmp_path / "run"
    assert launch(base(ref), tmp=tmp_path).ok
    assert complete_steps(ref) == [6, 8]
    assert at_rest(ref) == []  # no lock, no staging: only checkpoints

    # The save of step 4, killed at four points; each restart resumes from step 2.
    first = True
    for point in ("model", "optimizer", "promote"):
        kill = [point, 2 if point == "model" else 1]
        run = launch(base(out, kill=kill, resume=not first), tmp=tmp_path)
        killed(run, tmp_path, point)
        first = False
        assert complete_steps(out) == [2]
        assert last_checkpoint(out) == str(out / "checkpoint-2")
        # What the kill left is hidden from Trainer's own listing too.
        assert get_last_checkpoint(str(out)) == str(out / "checkpoint-2")
        assert any(TMP_INFIX in n for n in os.listdir(out))

    # Step 6 is committed, then rotation is killed while deleting checkpoint-2.
    run = launch(base(out, kill=["retain", 1], resume=True), tmp=tmp_path)
    killed(run, tmp_path, "retain")
    steps = complete_steps(out)
    assert len(steps) >= LIMIT
    assert steps[-LIMIT:] == [4, 6]

    # The last restart resumes from step 6, trains to 8, and the leftovers go.
    result = tmp_path / "result.json"
    run = launch(base(out, resume=True, result=str(result)), tmp=tmp_path)
    assert run.ok, run.logs[0]
    assert json.loads(result.read_text()) == {
        "resumed_from": str(out / "checkpoint-6"),
        "global_step": STEPS,
    }
    assert complete_steps(out) == [6, 8]
    assert at_rest(out) == []
    same_training(ref, out)


# Before 5.18 Trainer itself cannot resume a multi-process run on CPU under this torch: it
# loads the optimizer with map_location="cpu:0", which torch.load refuses ("don't know how
# to restore data location"), with or without atomic_ckpt. One process is tested above.
@pytest.mark.skipif(
    Version(transformers.__version__) < Version("5.18"),
    reason="transformers < 5.18 cannot resume a multi-process CPU run (map_location='cpu:0')",
)
@pytest.mark.parametrize("world", [2])
def test_two_rank_trainer_killed_mid_save_resumes_bit_identical(tmp_path: Path, world: int) -> None:
    """DDP on 2 gloo processes: rank 0 killed inside the model write, then rank 1 killed
    writing its RNG state; the restarts resume from the newest complete checkpoint and
    end bit-identical to an uninterrupted 2-process run, with every rank's RNG file."""
    ref, out = tmp_path / "ref", tmp_path / "run"
    run = launch(base(ref), world=world, tmp=tmp_path)
    assert run.ok, run.logs
    assert complete_steps(ref) == [6, 8]
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= set(os.listdir(ref / "checkpoint-8"))

    run = launch(base(out, kill=["model", 2]), world=world, kill_rank=0, tmp=tmp_path)
    killed(run, tmp_path, "model", rank=0)
    assert run.codes[1] != 0  # rank 1 does not carry on alone
    assert complete_steps(out) == [2]

    run = launch(base(out, kill=["rng", 1], resume=True), world=world, kill_rank=1, tmp=tmp_path)
    killed(run, tmp_path, "rng", rank=1)
    assert complete_steps(out) == [2]

    result = tmp_path / "result.json"
    run = launch(base(out, resume=True, result=str(result)), world=world, tmp=tmp_path)
    assert run.ok, run.logs
    assert json.loads(result.read_text())["resumed_from"] == str(out / "checkpoint-2")
    assert complete_steps(out) == [6, 8]
    assert at_rest(out) == []
    same_training(ref, out)
