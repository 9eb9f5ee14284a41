"""Accelerate's ``save_state`` / ``load_state`` through atomic, durable commits.

    python examples/hf_accelerate.py PROJECT_DIR [--steps 30]
    accelerate launch --cpu --num_processes 2 examples/hf_accelerate.py PROJECT_DIR

Trains a small model, committing ``PROJECT_DIR/checkpoints/checkpoint_<step>/`` every 5
steps and keeping the last 2 (what ``ProjectConfiguration(automatic_checkpoint_naming=True,
total_limit=2)`` did, without its failure modes). Kill it and run it again: it resumes
from the newest complete checkpoint, at the same batch. Prints ``resumed from step N``
or ``fresh start``, then ``done <step>``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration

from atomic_ckpt import CheckpointDir, RetentionPolicy
from atomic_ckpt.integrations.accelerate import load_state, save_state


class Progress:
    """Any object with state_dict/load_state_dict can ride along in the checkpoint."""

    def __init__(self) -> None:
        self.samples = 0

    def state_dict(self) -> dict[str, int]:
        return {"samples": self.samples}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.samples = state["samples"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("project_dir", type=Path)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()

    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(4096, 8, generator=torch.Generator().manual_seed(1))
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
    loader = torch.utils.data.DataLoader(
        data, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(2)
    )
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)

    ckpts = CheckpointDir(args.project_dir / "checkpoints", prefix="checkpoint_")
    step = load_state(accelerator, ckpts) or 0  # every process; rank 0 chooses
    accelerator.print(f"resumed from step {step}" if step else "fresh start")
    # Within an epoch, skip the batches the checkpoint already trained on.
    batches = accelerator.skip_first_batches(loader, step % len(loader)) if step else loader
    while step < args.steps:
        for xb, yb in batches:
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            progress.samples += len(xb)
            if step % 5 == 0:
                save_state(accelerator, ckpts, step, retain=RetentionPolicy(keep_last=2))
            if step >= args.steps:
                break
        batches = loader
    accelerator.print(f"done {step}")


if __name__ == "__main__":
    main()
