"""Two gloo ranks commit once and then end the way a training script does (no os._exit).

Run: ``python exit_cleanly.py ROOT INIT_FILE destroy|keep``. Exits 0 when every
rank exited 0; otherwise prints each rank's exit status and exits 1.
"""

from __future__ import annotations

import sys

import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank: int, root: str, init: str, destroy: bool) -> None:
    from atomic_ckpt import CheckpointDir
    from atomic_ckpt.distributed import distributed_commit

    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    with distributed_commit(CheckpointDir(root), 1) as path:
        (path / f"rank{rank}.bin").write_bytes(b"x")
    if destroy:
        dist.destroy_process_group()


if __name__ == "__main__":
    root, init, how = sys.argv[1:4]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=rank_main, args=(r, root, init, how == "destroy")) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    codes = [p.exitcode for p in procs]
    print("exit codes:", codes)
    sys.exit(0 if codes == [0, 0] else 1)
