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
"""

from __future__ import annotations

import argparse
import hashlib
import json
import signal
import sys
import threading
from contextlib import AbstractContextManager
from pathlib import Path

import torch

from atomic_ckpt import (
    CheckpointDir,
    CheckpointNotFoundError,
    RetentionPolicy,
    UnmarkedCheckpointsError,
)
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
        self.epoch = self.done = self.global_step = 0  # where training continues

    def save(self, commit: AbstractContextManager[Path]) -> None:
        """Write the training state into a commit's staging dir; leaving the block publishes."""
        with commit as path:
            write_state(
                path,
                step=self.global_step,
                model=self.model,
                optimizer=self.opt,
                scheduler=self.sched,
                epoch=self.epoch,
            )

    def position(self, complete: bool) -> dict[str, object]:
        return {
            "epoch": self.epoch,
            "steps_done": self.done,
            "global_step": self.global_step,
            "epoch_complete": complete,
        }

    def save_epoch(self) -> None:
        alias = f"epoch{self.epoch}_step{self.global_step}"
        commit = self.ckpts.commit(
            self.epoch, metadata=self.position(True), aliases=[alias], replace_aliases=True
        )  # a re-saved epoch keeps one label, its own
        self.save(commit)
        self.validate_and_amend(self.epoch)

    def validate_and_amend(self, epoch: int) -> None:
        """Validation after the save: amend the checkpoint, then point the best and prune."""
        loss = validate(self.model, self.args.seed)
        with self.ckpts.amend(epoch, metadata={"val_loss": loss}) as path:
            (path / "val_metrics.json").write_text(json.dumps({"val_loss": loss}) + "\n")
        self.ckpts.retain(RETAIN)
        print(f"epoch {epoch} val_loss {loss:.6f}", flush=True)

    def resume(self) -> None:
        """Promote a newer `interrupted` checkpoint, then load the newest complete one."""
        try:
            named = self.ckpts.get_named(INTERRUPTED)
        except CheckpointNotFoundError:
            named = None
        latest = self.ckpts.latest()
        newest = latest.manifest.metadata.get("global_step", -1) if latest else -1
        if named is not None and named.manifest.metadata["global_step"] >= newest:
            self.ckpts.promote_named(INTERRUPTED, named.manifest.metadata["epoch"])
        ckpt = self.ckpts.resume_point(fresh=self.args.fresh)  # refuses unmarked dirs
        self.ckpts.clean()  # what a killed run left behind: staging dirs, old copies
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
            if "val_loss" not in meta:  # killed between the save and its amend
                self.validate_and_amend(self.epoch)
            else:  # killed, maybe, between the amend and the retention
                self.ckpts.retain(RETAIN)
            self.epoch, self.done = self.epoch + 1, 0
        print(f"resumed from {ckpt.path.name}: epoch {self.epoch} step {self.done}", flush=True)

    def run(self, stop: threading.Event) -> int:
        while self.epoch < self.args.epochs:
            while self.done < self.args.steps_per_epoch:
                train_step(self.model, self.opt, *batch(self.args.seed, self.epoch, self.done))
                self.done, self.global_step = self.done + 1, self.global_step + 1
                if stop.is_set():
                    self.save(self.ckpts.commit_named(INTERRUPTED, metadata=self.position(False)))
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
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # acted on after the current step
    trainer = Trainer(args)
    try:
        trainer.resume()
    except UnmarkedCheckpointsError as exc:
        print(f"refusing to start: {exc}\nTo start from scratch anyway: --fresh", file=sys.stderr)
        return 2
    return trainer.run(stop)


if __name__ == "__main__":
    sys.exit(main())
