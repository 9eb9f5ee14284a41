"""DeepSpeed's ``engine.save_checkpoint`` inside one multi-rank atomic commit (CPU-runnable).

    DS_ACCELERATOR=cpu torchrun --nproc_per_node=2 examples/hf_deepspeed.py RUN_DIR [STEPS]

Every rank enters ``distributed_commit``; DeepSpeed writes its tag directory (model states,
every rank's ZeRO optimizer shards) into rank 0's staging directory; rank 0 promotes it
once all ranks succeeded. ``save_latest=False``: DeepSpeed's ``latest`` file (written in
place by rank 0, without fsync, before its final barrier) is not needed, because the
checkpoint's step is its directory name and ``resume()`` picks the newest complete one.
On start the script resumes from there. Prints ``resumed <step>`` and ``done <step>``.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed
import torch
import torch.distributed as dist

from atomic_ckpt import CheckpointDir, RetentionPolicy
from atomic_ckpt.distributed import distributed_commit, resume

TAG = "ds"  # a fixed tag: the step is the checkpoint directory's name


def main(run_dir: str, steps: int) -> None:
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2),
        config={
            "train_batch_size": 2 * dist.get_world_size(),
            "zero_optimization": {"stage": 1},
            "zero_allow_untested_optimizer": True,
        },
    )
    ckpts = CheckpointDir(run_dir)
    start = 0
    found = resume(ckpts)  # rank 0 chooses, every rank gets the same answer
    if found is not None:
        engine.load_checkpoint(str(found.path), tag=TAG)
        start = found.step
    if dist.get_rank() == 0:
        print(f"resumed {start}", flush=True)
    for step in range(start + 1, steps + 1):
        g = torch.Generator().manual_seed(1000 * step + dist.get_rank())  # data by step
        x = torch.randn(2, 8, generator=g)
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        engine.step()
        if step % 2 == 0:
            with distributed_commit(ckpts, step, retain=RetentionPolicy(keep_last=2)) as path:
                engine.save_checkpoint(str(path), tag=TAG, save_latest=False)
    if dist.get_rank() == 0:
        print(f"done {steps}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 6)
