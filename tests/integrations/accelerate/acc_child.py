"""A small model trained with Accelerate on CPU, saved and resumed through
``atomic_ckpt.integrations.accelerate``: what the tests run on 1 or 2 processes.

Phase ``save`` trains ``STEPS`` steps, committing ``save_state`` at ``SAVES``, and records
the final state; phase ``resume`` starts over in new processes, loads the newest complete
checkpoint with ``load_state``, skips the batches already seen and trains to ``STEPS``.
Both record the parameters, the optimizer state, a registered object and what was
resumed, to ``<out>/<phase>.pt`` (rank 0).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

torch.set_num_threads(1)

from accelerate import Accelerator  # noqa: E402
from accelerate.utils import DataLoaderConfiguration, ProjectConfiguration  # noqa: E402

from atomic_ckpt import CheckpointDir, RetentionPolicy  # noqa: E402
from atomic_ckpt.integrations.accelerate import load_state, save_state  # noqa: E402

STEPS = 9
SAVES = (3, 5)


class Counter:
    """A custom object registered with ``register_for_checkpointing``."""

    def __init__(self) -> None:
        self.seen = 0

    def state_dict(self) -> dict[str, int]:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seen = state["seen"]


def main(out: Path, phase: str) -> None:
    project = out / "project"
    accelerator = Accelerator(
        cpu=True,
        # Automatic naming on, as a script written for it would have it: the helpers
        # switch it off while they save and load.
        project_config=ProjectConfiguration(
            project_dir=str(project), automatic_checkpoint_naming=True
        ),
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
    )
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(48, 4, generator=g), torch.randn(48, 4, generator=g)
    data = torch.utils.data.TensorDataset(x, y)
    # Its own generator: creating an iterator draws a seed from it, never from the global
    # RNG whose state (dropout's) the checkpoint restores.
    loader = torch.utils.data.DataLoader(
        data, batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(2)
    )
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    ckpts = CheckpointDir(project / "checkpoints", prefix="checkpoint_")

    step = 0
    resumed = None
    if phase == "resume":
        resumed = load_state(accelerator, ckpts)
        step = resumed or 0
    iteration = accelerator.project_configuration.iteration
    # STEPS stays within the first epoch: the batches a resumed run has not seen yet are
    # that epoch's (its order restored with the sampler state) after the first ``step``.
    assert len(loader) >= STEPS
    epoch_loader = loader
    if resumed is not None:
        epoch_loader = accelerator.skip_first_batches(loader, resumed)
    if step < STEPS:
        for x, y in epoch_loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            step += 1
            counter.seen += 1
            if step in SAVES:
                save_state(accelerator, ckpts, step, retain=RetentionPolicy(keep_last=1))
            if step >= STEPS:
                break
    if accelerator.is_main_process:
        record: dict[str, Any] = {
            "params": accelerator.unwrap_model(model).state_dict(),
            "optimizer": optimizer.state_dict(),
            "counter": counter.seen,
            "resumed": resumed,
            "iteration_after_load": iteration,
            "steps": ckpts.steps(),
        }
        torch.save(record, out / f"{phase}.pt")
    accelerator.wait_for_everyone()
    accelerator.end_training()


def run(out: str, phase: str, env: dict[str, str], log: str) -> None:
    """Entry point in a process forked from the test's forkserver."""
    os.environ.update(env)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    main(Path(out), phase)
