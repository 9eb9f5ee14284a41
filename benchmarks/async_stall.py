"""The stall a checkpoint puts on a training loop: AsyncCommitter against a synchronous commit.

Run ``python benchmarks/async_stall.py`` (about a minute; ``--quick`` for a
smoke run). A toy training loop (an MLP with Adam, CPU) runs ``--steps`` steps
and checkpoints every ``--every`` steps, three ways, side by side in one run
(the order rotates each repetition):

* ``none``: no checkpoint (the baseline);
* ``sync``: ``with ckpts.commit(step): torch.save(state)`` in the loop;
* ``async``: ``AsyncCommitter.save(step, state)`` (copies the state, returns).

The stall of a method is its loop time minus the baseline's, per checkpoint;
the report gives medians over the repetitions and the ratio async/sync. Also
shown: the time the loop thread spends inside the checkpoint call itself. The
async loop's time includes any back-pressure wait (a save waiting for the
previous commit) but not the final drain after the last step, which is
reported separately. Every commit is durable (fsync, manifest, rename).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch

from _harness import Stopwatch
from atomic_ckpt import AsyncCommitter, CheckpointDir


def make_model(params_mb: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    width = int((params_mb * 2**20 / 4 / 4) ** 0.5)  # four square-ish layers
    model = torch.nn.Sequential(
        *[torch.nn.Linear(width, width) for _ in range(4)],
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    return model, opt


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, batch: torch.Tensor) -> None:
    opt.zero_grad(set_to_none=True)
    loss = model(batch).square().mean()
    loss.backward()
    opt.step()


def state_of(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    return {"model": model.state_dict(), "optimizer": opt.state_dict()}


def run(method: str, root: Path, args: argparse.Namespace) -> dict[str, float]:
    torch.manual_seed(0)
    model, opt = make_model(args.params_mb)
    width = model[0].in_features  # type: ignore[index]
    batch = torch.randn(args.batch, width)
    train_step(model, opt, batch)  # allocate Adam's state before timing
    shutil.rmtree(root, ignore_errors=True)
    ckpts = CheckpointDir(root)
    saver = AsyncCommitter(ckpts) if method == "async" else None
    in_call = Stopwatch()
    with Stopwatch() as loop:
        for step in range(1, args.steps + 1):
            train_step(model, opt, batch)
            if method != "none" and step % args.every == 0:
                with in_call:
                    if saver is not None:
                        saver.save(step, state_of(model, opt))
                    else:
                        with ckpts.commit(step) as path:
                            torch.save(state_of(model, opt), path / "state.pt")
    drain = Stopwatch()
    if saver is not None:
        with drain:
            saver.close()
    if method != "none":
        assert ckpts.steps()[-1] == args.steps - args.steps % args.every
    return {"loop": loop.seconds, "in_call": in_call.seconds, "drain": drain.seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params-mb", type=int, default=48, help="model size (state is ~3x: Adam)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--data-dir", default=None, help="where checkpoints go (default: $TMPDIR)")
    ap.add_argument("--quick", action="store_true", help="a small, fast smoke run")
    args = ap.parse_args()
    if args.quick:
        args.params_mb, args.steps, args.every, args.reps = 8, 12, 4, 1
    checkpoints = args.steps // args.every
    results: dict[str, list[dict[str, float]]] = {"none": [], "sync": [], "async": []}
    methods = list(results)
    with tempfile.TemporaryDirectory(prefix="async_stall-", dir=args.data_dir) as tmp:
        for rep in range(args.reps):
            order = methods[rep % 3 :] + methods[: rep % 3]
            for method in order:
                results[method].append(run(method, Path(tmp) / method, args))
    med = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in results.items()}
    base = med["none"]["loop"]
    per_step = base / args.steps
    stall = {m: (med[m]["loop"] - base) / checkpoints for m in ("sync", "async")}
    state_mb = 3 * args.params_mb
    print(
        f"toy loop: {args.steps} steps of {per_step * 1e3:.0f} ms, a checkpoint "
        f"(~{state_mb} MB: model + Adam) every {args.every} steps, {args.reps} reps, medians"
    )
    print(f"{'method':<8}{'loop s':>9}{'stall/ckpt s':>14}{'in call/ckpt s':>16}{'drain s':>9}")
    for m in methods:
        s = stall.get(m, 0.0)
        print(
            f"{m:<8}{med[m]['loop']:>9.2f}{s:>14.3f}"
            f"{med[m]['in_call'] / max(1, checkpoints) if m != 'none' else 0:>16.3f}"
            f"{med[m]['drain']:>9.2f}"
        )
    ratio = stall["async"] / stall["sync"] if stall["sync"] > 0 else float("nan")
    call_ratio = med["async"]["in_call"] / med["sync"]["in_call"]
    print(f"stall ratio async/sync (loop time over baseline): {ratio:.2f}")
    print(f"in-call ratio async/sync (time blocked in the checkpoint call): {call_ratio:.2f}")


if __name__ == "__main__":
    main()
