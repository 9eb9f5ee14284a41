"""``AtomicTrainer`` over a checkpoint it may not replace silently (issue 30 gap a): a
named checkpoint moved by hand to ``checkpoint-2``. Its save refuses, naming the option a
Trainer user has (the constructor's ``replace_unusable=True``, taken as ``dedup`` and
``durable`` are); with it the save replaces the moved checkpoint knowingly."""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import torch
from hf_trainer_child import dataset, tokenizer
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

from atomic_ckpt import CheckpointDir, StepConflictError
from atomic_ckpt.integrations.transformers import AtomicTrainer

torch.set_num_threads(1)


def _trainer(out: Path, **atomic: Any) -> AtomicTrainer:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=16)
    )
    args = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=2,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        save_strategy="steps",
        save_steps=2,
        max_steps=2,
    )
    return AtomicTrainer(
        model=model, args=args, train_dataset=dataset(), processing_class=tokenizer(), **atomic
    )


def _moved(out: Path) -> None:
    """A named checkpoint ``interrupted`` moved by hand to ``checkpoint-2``."""
    ckpts = CheckpointDir(out, prefix="checkpoint-")
    with ckpts.commit_named("interrupted") as path:
        (path / "note.txt").write_text("interrupt save")
    os.rename(out / "interrupted", out / "checkpoint-2")


def test_the_refusal_names_the_trainer_option_and_the_option_replaces(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _moved(out)
    with pytest.raises(StepConflictError) as caught:
        _trainer(out).train()
    message = str(caught.value)
    assert "AtomicTrainer(..., replace_unusable=True)" in message, message
    assert (out / "checkpoint-2" / "note.txt").read_text() == "interrupt save"
    assert "replace_unusable" in inspect.signature(AtomicTrainer).parameters
    _trainer(out, replace_unusable=True).train()
    ckpts = CheckpointDir(out, prefix="checkpoint-")
    assert ckpts.verify(2).manifest.step == 2
    assert not (out / "checkpoint-2" / "note.txt").exists()
