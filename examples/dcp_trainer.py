"""A torchtitan-style loop: async DCP saves every k steps, resumed from latest() after a kill.

    python examples/dcp_trainer.py RUN_DIR [--ranks 2] [--steps 12] [--every 3] [--kill-at S]

Starts ``--ranks`` gloo processes on the CPU (as torchrun would), each training the
same small model data-parallel (gradients all-reduced). Every ``--every`` steps the
state (model, Adam, step) is saved with ``dcp.async_save`` through an
:class:`atomic_ckpt.dcp.AtomicWriter`: training continues while the background
thread writes, and ``RUN_DIR/<step>/`` appears complete and durable, or not at all.
The last two checkpoints are kept. On start, rank 0 removes what a killed save left
(``clean()``), ``resume()`` picks the newest complete checkpoint (rank 0 chooses,
every rank agrees) and plain ``dcp.load`` restores it.

``--kill-at S`` SIGKILLs every rank right after the save of step ``S`` was started
(a node failure in the middle of a background save); run again without it and the
job resumes and ends bit-identical to a run that was never stopped. Prints
``resumed from step N`` (or ``fresh start``) and ``final <sha256 of the weights>``.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing as mp
import os
import signal
import sys
import tempfile
from concurrent.futures import Future
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

from atomic_ckpt import CheckpointDir, RetentionPolicy
from atomic_ckpt.dcp import AtomicWriter
from atomic_ckpt.distributed import resume

KILLED = 3
"""The launcher's exit status when the ranks were killed on purpose (--kill-at)."""


class AppState(Stateful):
    """What a checkpoint holds: DCP calls state_dict() to save and load_state_dict() to load."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer, self.step = model, optimizer, 0

    def state_dict(self) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd, "step": self.step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state_dict["model"],
            optim_state_dict=state_dict["optim"],
        )
        self.step = state_dict["step"]


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each rank's batch for a step: the same in every run, so resuming needs no loader state."""
    g = torch.Generator().manual_seed(step * 1009 + rank)
    x = torch.randn(16, 8, generator=g)
    return x, x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(16, 1, generator=g)


def train(rank: int, world: int, init: str, opts: dict[str, Any]) -> None:
    """One rank of the job."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=120),
    )
    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    app = AppState(model, optimizer)
    ckpts = CheckpointDir(opts["run_dir"])
    # An async save runs DCP's collectives in a background thread while training runs
    # its own: they need a process group of their own (as torchtitan does), or the two
    # threads' collectives interleave on one group and hang.
    save_group = dist.new_group(backend="gloo")

    if rank == 0:
        ckpts.clean()  # what a killed save left (its staging dir), before anyone writes
    latest = resume(ckpts)  # rank 0 scans the root; every rank gets its choice
    if latest is None:
        if rank == 0:
            print("fresh start", flush=True)
    else:
        state = {"app": app}
        dcp.load(state, checkpoint_id=latest.path)  # plain DCP reads it
        if rank == 0:
            print(f"resumed from step {app.step}", flush=True)

    pending: Future[Any] | None = None
    for step in range(app.step + 1, opts["steps"] + 1):
        x, y = batch(rank, step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        for p in model.parameters():
            assert p.grad is not None
            dist.all_reduce(p.grad)
            p.grad /= world
        optimizer.step()
        app.step = step
        if step % opts["every"] == 0:
            # A new writer waits for the previous async save (on_pending="wait").
            writer = AtomicWriter(
                ckpts, step, retain=RetentionPolicy(keep_last=2), process_group=save_group
            )
            pending = dcp.async_save(  # type: ignore[assignment]
                {"app": app}, storage_writer=writer, process_group=save_group
            )
            if step == opts["kill_at"]:
                os.kill(os.getpid(), signal.SIGKILL)  # mid-save, on every rank
    if pending is not None:
        pending.result()  # the last save is committed before the job ends
    if rank == 0:
        digest = hashlib.sha256()
        for name, tensor in sorted(model.state_dict().items()):
            digest.update(name.encode() + tensor.numpy().tobytes())
        print(f"final {digest.hexdigest()}", flush=True)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("run_dir")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--every", type=int, default=3)
    parser.add_argument("--kill-at", type=int, default=-1)
    args = parser.parse_args(argv)
    opts = {"run_dir": args.run_dir, "steps": args.steps, "every": args.every}
    opts["kill_at"] = args.kill_at
    with tempfile.TemporaryDirectory() as tmp:
        ctx = mp.get_context("spawn")
        init = str(Path(tmp) / "init")
        procs = [
            ctx.Process(target=train, args=(r, args.ranks, init, opts)) for r in range(args.ranks)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
    codes = [p.exitcode for p in procs]
    if codes == [0] * args.ranks:
        return 0
    if args.kill_at >= 0 and all(c == -signal.SIGKILL for c in codes):
        print(f"killed at step {args.kill_at}", flush=True)
        return KILLED
    print(f"ranks failed: exit codes {codes}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
