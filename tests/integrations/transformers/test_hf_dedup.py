"""``AtomicTrainer(dedup=True)`` (tiny GPT-2, CPU): the ``save_pretrained`` shards that
hold only frozen weights, and the files every checkpoint repeats (config, tokenizer,
training arguments), are stored once; each checkpoint stays whole, verifies and resumes,
and rotation deleting the older one loses nothing."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import torch
from hf_trainer_child import dataset, tokenizer
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

from atomic_ckpt import CheckpointDir
from atomic_ckpt.integrations.transformers import AtomicTrainer

torch.set_num_threads(1)


def _trainer(out: Path, *, dedup: bool, **args: Any) -> AtomicTrainer:
    """A GPT-2 whose embeddings and first block are frozen, saved in small shards (as a
    large model's ``save_pretrained`` shards are), so some shards hold frozen tensors only."""
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    )
    for name, param in model.named_parameters():
        if name.startswith(("transformer.wte", "transformer.wpe", "transformer.h.0.")):
            param.requires_grad_(False)
    model.save_pretrained = functools.partial(  # type: ignore[method-assign]
        model.save_pretrained, max_shard_size="8KB"
    )
    options: dict[str, Any] = {
        "per_device_train_batch_size": 2,
        "report_to": [],
        "use_cpu": True,
        "disable_tqdm": True,
        "save_strategy": "steps",
        "save_steps": 2,
        "max_steps": 4,
        "learning_rate": 1e-2,
        **args,
    }
    return AtomicTrainer(
        model=model,
        args=TrainingArguments(output_dir=str(out), **options),
        train_dataset=dataset(),
        processing_class=tokenizer(),
        dedup=dedup,
    )


def _shards(path: Path) -> list[str]:
    return sorted(n for n in os.listdir(path) if n.startswith("model-") and "safetensors" in n)


def _same_inode(a: Path, b: Path) -> bool:
    return os.lstat(a).st_ino == os.lstat(b).st_ino


def test_frozen_shards_and_repeated_files_are_stored_once(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _trainer(out, dedup=True).train()
    ckpts = CheckpointDir(out, prefix="checkpoint-")
    assert ckpts.steps() == [2, 4]
    two, four = ckpts.path_of(2), ckpts.path_of(4)
    shards = _shards(four)
    assert len(shards) > 2, shards  # the sharding above took effect
    linked = [n for n in shards if _same_inode(two / n, four / n)]
    written = [n for n in shards if not _same_inode(two / n, four / n)]
    assert linked, "no shard of frozen weights was deduplicated"
    assert written, "a shard holding trained weights was linked"
    for name in ("config.json", "tokenizer.json", "training_args.bin"):
        assert _same_inode(two / name, four / name), name
    for name in ("optimizer.pt", "trainer_state.json", "rng_state.pth"):
        assert not _same_inode(two / name, four / name), name
    # The linked shards hold exactly what step 4 would have written: the frozen tensors.
    for name in linked:
        assert (two / name).read_bytes() == (four / name).read_bytes()
    ckpts.verify(2)
    ckpts.verify(4)


def test_without_dedup_every_checkpoint_has_its_own_files(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _trainer(out, dedup=False).train()
    ckpts = CheckpointDir(out, prefix="checkpoint-")
    assert all(os.lstat(ckpts.path_of(4) / n).st_nlink == 1 for n in _shards(ckpts.path_of(4)))


def test_rotation_of_the_source_loses_nothing_and_the_run_resumes(tmp_path: Path) -> None:
    """save_total_limit=1 deletes checkpoint-2 after checkpoint-4 linked its files: 4
    keeps every byte, verifies, and a new trainer resumes from it to step 6."""
    out = tmp_path / "out"
    _trainer(out, dedup=True, save_total_limit=1).train()
    ckpts = CheckpointDir(out, prefix="checkpoint-")
    assert ckpts.steps() == [4]
    assert all(os.lstat(ckpts.path_of(4) / n).st_nlink == 1 for n in os.listdir(ckpts.path_of(4)))
    ckpts.verify(4)
    resumed = _trainer(out, dedup=True, save_total_limit=1, max_steps=6)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 6
    assert ckpts.steps() == [6]
    ckpts.verify(6)
