"""The Hugging Face final-save rows: how a script ends (``run_clm.py`` and most others):
``trainer.save_model()`` then ``trainer.save_state()`` straight into ``output_dir``.

Save 1: a fresh run of 1 step (``save_strategy="no"``: no checkpoint) ends with the final
save into ``ckpt/``. Save 2: another fresh run (another seed) ends the same way, over it.
Save 3: a third run's final save on a disk that fills up half-way through
``model.safetensors``. The state a save writes is the model's ``state_dict``, digested just
before ``save_model``; the check loads ``ckpt/`` as a user loads a final model
(``AutoModelForCausalLM.from_pretrained``) and digests the same. A ``trainer_state.json``
that is there must parse. No weights file at all is nothing saved (a fresh start).
Per-file atomicity is what is asked of the final save: which save each file comes from is
not checked across files (the config is the same in every save).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainingArguments,
)

import _common
import _hf

WEIGHTS = "model.safetensors"


def trainer(cls: type[Trainer], out: Path, seed: int) -> Trainer:
    """A ``cls`` (Trainer or AtomicTrainer) training a tiny GPT-2 for 1 step, saving nothing
    until the script's final save into ``out``."""
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(
        GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=_hf.VOCAB, n_positions=8)
    )
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=1,
        save_strategy="no",
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        report_to=[],
        use_cpu=True,
        seed=seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
        logging_strategy="no",
    )
    return cls(model=model, args=args, train_dataset=_hf.dataset(seed))


def _final_save(root: Path, save: int, run: Trainer) -> None:
    _common.begin(root, save, _common.digest({"model": run.model.state_dict()}))
    run.save_model()  # as run_clm.py ends
    run.save_state()


def workload(root: Path, cls: type[Trainer]) -> None:
    """The three final saves (module docstring) with ``cls`` as the trainer."""
    out = root / "ckpt"
    _common.open_journal(root)
    for save in (1, 2):
        run = trainer(cls, out, save)
        run.train()
        _final_save(root, save, run)
        _common.returned(root, save)
    limit = os.path.getsize(out / WEIGHTS) // 2
    third = trainer(cls, out, 3)
    third.train()
    _common.failing_save(root, 3, limit, lambda: _final_save(root, 3, third))


def check(root: Path) -> str:
    """Load the final model from ``ckpt/`` (and its ``trainer_state.json``); judge it."""
    out = root / "ckpt"
    if not (out / WEIGHTS).exists():
        return _common.judge(root, None, "ckpt/")
    try:
        model: Any = AutoModelForCausalLM.from_pretrained(out)
    except Exception as exc:
        raise _common.Violation(f"cannot load ckpt/: {type(exc).__name__}: {exc}") from exc
    state = out / "trainer_state.json"
    if state.exists():
        try:
            json.loads(state.read_text())
        except (ValueError, UnicodeDecodeError) as exc:
            raise _common.Violation(f"cannot load ckpt/trainer_state.json: {exc}") from exc
    return _common.judge(root, _common.digest({"model": model.state_dict()}), "ckpt/")
