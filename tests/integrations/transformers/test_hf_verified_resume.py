"""``AtomicTrainer(verify_on_resume=True).train(resume_from_checkpoint=True)``: the newest
checkpoint that verifies is resumed, and Trainer's own loads are served from the pages the
verification hashed (held until each load returns): each byte is read from storage once."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from treeutil import evict, storage_bytes

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import torch
import transformers
from hf_trainer_child import dataset, tokenizer
from packaging.version import Version
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

from atomic_ckpt import CheckpointDir
from atomic_ckpt.integrations.transformers import AtomicTrainer

torch.set_num_threads(1)


class SpyTrainer(AtomicTrainer):
    """Notes which checkpoint files are still mapped when each of Trainer's loads starts."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.held: dict[str, set[str]] = {}

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        self.held["model"] = set(self._atomic_views)
        super()._load_from_checkpoint(resume_from_checkpoint, model)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        self.held["optimizer"] = set(self._atomic_views)
        super()._load_optimizer_and_scheduler(checkpoint)

    def _load_rng_state(self, checkpoint: str | None) -> None:
        self.held["rng"] = set(self._atomic_views)
        super()._load_rng_state(checkpoint)


def make_trainer(out: Path, *, width: int = 32, verify: bool, **args: Any) -> SpyTrainer:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=width, n_head=2, vocab_size=64))
    options: dict[str, Any] = {
        "per_device_train_batch_size": 2,
        "report_to": [],
        "use_cpu": True,
        "disable_tqdm": True,
        "save_strategy": "steps",
        "learning_rate": 1e-2,
        **args,
    }
    return SpyTrainer(
        model=model,
        args=TrainingArguments(output_dir=str(out), **options),
        train_dataset=dataset(),
        processing_class=tokenizer(),
        verify_on_resume=verify,
    )


def weights(trainer: AtomicTrainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def test_a_verified_resume_ends_where_an_unverified_one_does(tmp_path: Path) -> None:
    """From copies of one run's checkpoints, resuming with and without verification trains
    to bit-identical weights; the verified one held the files each load reads while it read
    them, and nothing once train returned."""
    first = tmp_path / "first"
    make_trainer(first, verify=False, max_steps=4, save_steps=2).train()
    plain, verified = tmp_path / "plain", tmp_path / "verified"
    shutil.copytree(first, plain)
    shutil.copytree(first, verified)

    a = make_trainer(plain, verify=False, max_steps=6, save_steps=2)
    a.train(resume_from_checkpoint=True)
    b = make_trainer(verified, verify=True, max_steps=6, save_steps=2)
    b.train(resume_from_checkpoint=True)
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert a.held == {"model": set(), "optimizer": set(), "rng": set()}  # unverified: none
    assert {"model.safetensors", "config.json", "optimizer.pt"} <= b.held["model"]
    assert "optimizer.pt" in b.held["optimizer"]
    assert "model.safetensors" not in b.held["optimizer"]  # released once it was loaded
    assert {"rng_state.pth", "trainer_state.json"} <= b.held["rng"]
    assert "optimizer.pt" not in b.held["rng"]
    assert b._atomic_views == {}


def test_a_newest_checkpoint_that_does_not_verify_is_passed_over_for_the_one_before(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One bit of checkpoint-4's optimizer state flipped (same size): the verified resume
    warns about checkpoint-4 and resumes from checkpoint-2, loading checkpoint-2's files."""
    out = tmp_path / "out"
    make_trainer(out, verify=False, max_steps=4, save_steps=2).train()
    damaged = out / "checkpoint-4" / "optimizer.pt"
    data = damaged.read_bytes()
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x01
    damaged.write_bytes(bytes(flipped))
    assert damaged.read_bytes() != data
    assert damaged.stat().st_size == len(data)

    trainer = make_trainer(out, verify=True, max_steps=5, save_steps=2)
    with caplog.at_level(logging.INFO):
        trainer.train(resume_from_checkpoint=True)
    messages = [r.getMessage() for r in caplog.records]
    assert any("checkpoint-4" in m and "does not verify" in m for m in messages)
    assert any(
        m == f"resuming from {out / 'checkpoint-2'}, the newest complete checkpoint"
        for m in messages
    )
    assert "optimizer.pt" in trainer.held["optimizer"]  # checkpoint-2's, mapped and verified


def test_a_verified_resume_reads_each_byte_of_the_checkpoint_from_storage_once(
    tmp_path: Path,
) -> None:
    """From a cold cache, verifying checkpoint-4 (~20 MiB: model, optimizer, RNG, state) and
    letting Trainer load it reads about its size from storage, not twice that."""
    if not Path("/proc/self/io").exists():
        pytest.skip("needs /proc/self/io (Linux)")
    out = tmp_path / "out"
    make_trainer(out, width=256, verify=False, max_steps=4, save_steps=4).train()
    warm = tmp_path / "warm"  # a first resume, so that what it imports is not counted
    shutil.copytree(out, warm)
    make_trainer(warm, width=256, verify=True, max_steps=5, save_steps=4).train(
        resume_from_checkpoint=True
    )
    ckpt = CheckpointDir(out, prefix="checkpoint-").get(4)
    total = sum(e.size for e in ckpt.manifest.files if e.type == "file")
    assert total > 16 << 20

    trainer = make_trainer(out, width=256, verify=True, max_steps=5, save_steps=4)
    os.sync()
    evict(ckpt.path)
    before = storage_bytes()
    trainer.train(resume_from_checkpoint=True)
    read = storage_bytes() - before
    assert {"model.safetensors", "optimizer.pt"} <= trainer.held["model"]
    if read == 0:  # a filesystem without storage (tmpfs): nothing to count
        pytest.skip(f"{tmp_path} reads nothing from storage")
    assert 0.9 * total <= read <= 1.1 * total, (read, total)


# Before 5.18 Trainer itself cannot resume a multi-process run on CPU under this torch (it
# loads the optimizer with map_location="cpu:0"), with or without atomic_ckpt.
@pytest.mark.skipif(
    Version(transformers.__version__) < Version("5.18"),
    reason="transformers < 5.18 cannot resume a multi-process CPU run (map_location='cpu:0')",
)
def test_on_two_ranks_each_rank_holds_what_it_loads_and_a_bad_shard_sends_both_back(
    tmp_path: Path,
) -> None:
    """Two gloo ranks, verify_on_resume: each rank hashes and holds the shared files and its
    own rng_state_<r>.pth, never the other's; the newest checkpoint with rank 1's RNG file
    damaged (same size) makes both ranks resume from the one before."""
    from hf_launch import launch

    out = tmp_path / "out"
    cfg: dict[str, object] = {"out": str(out), "steps": 4, "save_steps": 2}
    assert launch(cfg, world=2, tmp=tmp_path).ok
    result = tmp_path / "result.json"
    resumed = {**cfg, "steps": 6, "resume": True, "verify": True, "result": str(result)}
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    run = launch(resumed, world=2, tmp=tmp_path)
    assert run.ok, run.logs
    for r in (0, 1):
        chosen, held = json.loads(Path(f"{result}.rank{r}").read_text())
        assert Path(chosen).name == "checkpoint-4"
        names = set(held.split(","))
        assert {"model.safetensors", "optimizer.pt", f"rng_state_{r}.pth"} <= names
        assert f"rng_state_{1 - r}.pth" not in names

    damaged = copy / "checkpoint-4" / "rng_state_1.pth"
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    run = launch({**resumed, "out": str(copy)}, world=2, tmp=tmp_path)
    assert run.ok, run.logs
    for r in (0, 1):
        chosen, _ = json.loads(Path(f"{result}.rank{r}").read_text())
        assert Path(chosen).name == "checkpoint-2"
    assert "rank 1" in run.logs[0]
    assert "rng_state_1.pth" in run.logs[0]
