"""An epoch-based trainer whose checkpoints survive SIGKILL, SIGTERM and restarts.

    python examples/epoch_trainer.py RUN_DIR [--epochs 4] [--steps-per-epoch 5] [--fresh]

* Each epoch is committed as ``RUN_DIR/<epoch>/`` with an alias ``epoch<e>_step<s>``.
* Validation runs after the save and amends that checkpoint (``val_metrics.json``
  and ``val_loss`` in its metadata); the best and the last two epochs are kept,
  ``checkpoint_best`` naming the best.
* SIGTERM (a preempted job) saves an ``interrupted`` checkpoint mid-epoch and exits 0;
  the next start promotes it and resumes from there.
* A restart resumes from the newest complete checkpoint and ends bit-identical to a
  run that was never stopped. A run directory of checkpoints written without
  atomic_ckpt (no markers) is refused unless ``--fresh``.
* Under ``torchrun`` (gloo) every rank trains the same model and rank 0 alone saves;
  the other ranks wait for its commit, and resume from the step rank 0 chose.

It mirrors the trainer this library was made for. Its *glue*, the statements that exist
only to adapt to the library (not the saves and loads, which replace ``torch.save`` and
``torch.load`` one for one), are the 16 lines marked ``# glue`` below.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from atomic_ckpt import CheckpointDir, RetentionPolicy, UnmarkedCheckpointsError  # glue
from atomic_ckpt.distributed import rank0_commit, resume
from atomic_ckpt.torch import load_state, write_state

INTERRUPTED = "interrupted"
RETAIN = RetentionPolicy(keep_last=2, keep_best=1, metric="val_loss")
TRUE_W = torch.linspace(-1.0, 1.0, 8).reshape(8, 1)


def batch(seed: int, epoch: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same batch for the same (epoch, step) in every run: resuming needs no loader state."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch * 1_009 + step + 1)
    x = torch.randn(32, 8, generator=g)
    return x, x @ TRUE_W + 0.1 * torch.randn(32, 1, generator=g)


def train_step(
    model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
) -> None:
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()


def validate(model: torch.nn.Module, seed: int) -> float:
    x, y = batch(seed, epoch=999_999, step=0)  # a held-out batch no epoch trains on
    with torch.no_grad():
        return torch.nn.functional.mse_loss(model(x), y).item()


class Trainer:
    def __init__(self, args: argparse.Namespace) -> None:
        torch.manual_seed(args.seed)
        self.args = args
        self.model = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
        )
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=1, gamma=0.8)
        self.ckpts = CheckpointDir(args.run_dir)
        self.rank0 = not dist.is_initialized() or dist.get_rank() == 0
        self.epoch = self.done = self.global_step = 0  # where training continues

    def position(self, complete: bool) -> dict[str, object]:
        return {
            "epoch": self.epoch,
            "steps_done": self.done,
            "global_step": self.global_step,
            "epoch_complete": complete,
        }

    def save_checkpoint(self, target: int | str, **options: Any) -> None:
        """Model, optimizer, scheduler and position into checkpoint ``target`` (an epoch,
        or a name): committed here when called alone, added to an open commit of it."""
        with rank0_commit(self.ckpts, target, join=True, **options) as path:  # glue
            if path is not None:  # rank 0 (the others wait for its commit)
                write_state(
                    path,
                    step=self.global_step,
                    model=self.model,
                    optimizer=self.opt,
                    scheduler=self.sched,
                    epoch=self.epoch,
                )

    def save_epoch(self) -> None:
        """The epoch's checkpoint, labelled ``epoch<e>_step<s>`` (a re-saved epoch keeps
        one label, its own), with the run's config; then validation amends it."""
        label = f"epoch{self.epoch}_step{self.global_step}"
        meta = self.position(True)
        with rank0_commit(
            self.ckpts, self.epoch, metadata=meta, aliases=[label], replace_aliases=True
        ) as path:
            self.save_checkpoint(self.epoch)  # joins this commit
            if path is not None:
                config = {k: v for k, v in vars(self.args).items() if k != "run_dir"}
                (path / "config.json").write_text(json.dumps(config, sort_keys=True) + "\n")
        self.validate_and_amend(self.epoch)

    def validate_and_amend(self, epoch: int) -> None:
        """Validation after the save: amend the checkpoint, then point the best and prune."""
        loss = validate(self.model, self.args.seed)
        if self.rank0:
            with self.ckpts.amend(epoch, metadata={"val_loss": loss}) as path:
                (path / "val_metrics.json").write_text(json.dumps({"val_loss": loss}) + "\n")
            self.ckpts.retain(RETAIN)
        print(f"epoch {epoch} val_loss {loss:.6f}", flush=True)

    def resume(self) -> None:
        """Promote a newer `interrupted` checkpoint, then load the newest complete one."""
        if self.rank0:  # glue
            named = {n.name: n for n in self.ckpts.named()}.get(INTERRUPTED)  # glue
            latest = self.ckpts.latest()  # glue
            newest = latest.manifest.metadata["global_step"] if latest else -1  # glue
            if named and named.manifest.metadata["global_step"] >= newest:  # glue
                self.ckpts.promote_named(named.name, named.manifest.metadata["epoch"])  # glue
            self.ckpts.clean()  # glue: what a killed run left behind
        ckpt = resume(self.ckpts, fresh=self.args.fresh)  # refuses unmarked dirs
        if ckpt is None:
            return
        load_state(ckpt, model=self.model, optimizer=self.opt, scheduler=self.sched)
        meta = ckpt.manifest.metadata
        self.epoch, self.done, self.global_step = (
            meta["epoch"],
            meta["steps_done"],
            meta["global_step"],
        )
        if meta["epoch_complete"]:
            if "val_loss" not in meta:  # glue: killed between the save and its amend
                self.validate_and_amend(self.epoch)  # glue
            elif self.rank0:  # glue: killed, maybe, between the amend and the retention
                self.ckpts.retain(RETAIN)  # glue
            self.epoch, self.done = self.epoch + 1, 0
        print(f"resumed from {ckpt.path.name}: epoch {self.epoch} step {self.done}", flush=True)

    def run(self, stop: threading.Event) -> int:
        while self.epoch < self.args.epochs:
            while self.done < self.args.steps_per_epoch:
                train_step(self.model, self.opt, *batch(self.args.seed, self.epoch, self.done))
                self.done, self.global_step = self.done + 1, self.global_step + 1
                if stop.is_set():
                    self.save_checkpoint(INTERRUPTED, metadata=self.position(False))
                    print(f"interrupted at epoch {self.epoch} step {self.done}", flush=True)
                    return 0
            self.sched.step()
            self.save_epoch()
            self.epoch, self.done = self.epoch + 1, 0
        digest = hashlib.sha256(
            b"".join(t.numpy().tobytes() for t in self.model.state_dict().values())
        )
        print(f"done {digest.hexdigest()}", flush=True)
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--steps-per-epoch", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--fresh", action="store_true", help="start over beside unmarked checkpoints"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if "WORLD_SIZE" in os.environ and not dist.is_initialized():  # under torchrun
        dist.init_process_group("gloo")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # acted on after the current step
    trainer = Trainer(args)
    try:
        trainer.resume()
    except UnmarkedCheckpointsError as exc:  # glue: the library's words, then ours
        print(f"refusing to start: {exc}\n(--fresh starts over)", file=sys.stderr)  # glue
        return 2  # glue
    return trainer.run(stop)


if __name__ == "__main__":
    sys.exit(main())
