"""The Hugging Face ``Trainer`` rows: a tiny random GPT-2 (nothing downloaded), three saves.

Save 1: a fresh run of 1 step saves ``checkpoint-1``. Save 2: another fresh run (another
seed) saves ``checkpoint-1`` again, over the first. Save 3: a run resumed with
``resume_from_checkpoint=True`` trains to step 2 and saves ``checkpoint-2`` on a disk that
fills up half-way through ``optimizer.pt`` (``model.safetensors`` fits). The state a
save writes is digested in ``on_step_end`` just before ``Trainer`` saves it (model,
optimizer, scheduler, global step), and the check digests the same after
``train(resume_from_checkpoint=True)`` has loaded them, in ``on_train_begin``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

torch.set_num_threads(1)

from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

import _common  # noqa: E402

VOCAB = 64


class Loaded(Exception):
    """Raised from ``on_train_begin`` by the check: the digest of what resuming loaded."""

    def __init__(self, digest: str) -> None:
        super().__init__(digest)
        self.digest = digest


def _state_digest(kwargs: dict[str, Any], step: int) -> str:
    return _common.digest(
        {
            "model": kwargs["model"].state_dict(),
            "optim": kwargs["optimizer"].state_dict(),
            "sched": kwargs["lr_scheduler"].state_dict(),
            "step": step,
        }
    )


class Journaled(TrainerCallback):
    """Before each save, record the digest of what it is about to write."""

    def __init__(self, root: Path, save: int) -> None:
        self.root, self.save = root, save

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if control.should_save:
            _common.begin(self.root, self.save, _state_digest(kwargs, state.global_step))


class Probe(TrainerCallback):
    """The check's callback: once resuming has loaded everything, report its digest."""

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        raise Loaded(_state_digest(kwargs, state.global_step))


def dataset(seed: int) -> list[dict[str, torch.Tensor]]:
    ids = torch.randint(0, VOCAB, (16, 8), generator=torch.Generator().manual_seed(seed))
    return [{"input_ids": row, "labels": row} for row in ids]


def trainer(cls: type[Trainer], out: Path, seed: int, steps: int, callback: Any) -> Trainer:
    """A ``cls`` (Trainer or AtomicTrainer) training a tiny GPT-2 for ``steps`` steps,
    saving every step into ``out``."""
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(
        GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=VOCAB, n_positions=8)
    )
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=steps,
        save_steps=1,
        save_strategy="steps",
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        report_to=[],
        use_cpu=True,
        seed=seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
        logging_strategy="no",
    )
    return cls(model=model, args=args, train_dataset=dataset(seed), callbacks=[callback])


def workload(root: Path, cls: type[Trainer]) -> None:
    """The three saves (module docstring) with ``cls`` as the trainer."""
    out = root / "ckpt"
    _common.open_journal(root)
    for save in (1, 2):
        trainer(cls, out, save, 1, Journaled(root, save)).train()
        _common.returned(root, save)
    first = out / "checkpoint-1"
    limit = os.path.getsize(first / "model.safetensors") + os.path.getsize(first / "optimizer.pt")
    third = trainer(cls, out, 3, 2, Journaled(root, 3))
    _common.failing_save(root, 3, limit // 2, lambda: third.train(resume_from_checkpoint=True))


def check(root: Path, cls: type[Trainer], newest: Any) -> str:
    """``newest(out)`` names the checkpoint the framework resumes from (None: fresh
    start); ``cls(...).train(resume_from_checkpoint=True)`` loads it. Judge what it loaded."""
    out = root / "ckpt"
    try:
        found = newest(out) if out.is_dir() else None
    except Exception as exc:
        raise _common.Violation(
            f"finding the checkpoint raised {type(exc).__name__}: {exc}"
        ) from exc
    if found is None:
        return _common.judge(root, None, "ckpt/")
    where = os.path.relpath(found, root)
    try:
        trainer(cls, out, 3, 2, Probe()).train(resume_from_checkpoint=True)
    except Loaded as loaded:
        return _common.judge(root, loaded.digest, where)
    except Exception as exc:
        raise _common.Violation(f"cannot resume from {where}: {type(exc).__name__}: {exc}") from exc
    raise _common.Violation(f"resuming from {where} never began training")
