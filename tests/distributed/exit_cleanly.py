"""One gloo rank of two: commit once, then end the way a training script does (no os._exit).

Run: ``python exit_cleanly.py RANK ROOT INIT_FILE destroy|keep``, once per rank, as a
launcher such as torchrun starts them (a fresh interpreter each, which ends by returning
from the script). The process exits 0 unless its interpreter's teardown aborts.
"""

from __future__ import annotations

import sys

import torch.distributed as dist

from atomic_ckpt import CheckpointDir
from atomic_ckpt.distributed import distributed_commit


def rank_main(rank: int, root: str, init: str, destroy: bool) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    with distributed_commit(CheckpointDir(root), 1) as path:
        (path / f"rank{rank}.bin").write_bytes(b"x")
    if destroy:
        dist.destroy_process_group()


if __name__ == "__main__":
    rank, root, init, how = sys.argv[1:5]
    rank_main(int(rank), root, init, how == "destroy")
