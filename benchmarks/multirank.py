"""What a multi-rank commit costs: 4 ranks against 1 rank writing the same total bytes.

Run ``python benchmarks/multirank.py`` (about a minute; ``--quick`` for a smoke
run). Each configuration starts its ranks (gloo on CPU, one process each) and
times ``--commits`` durable commits of ``--mb`` MB in total, split evenly
between the ranks (one file per rank), each timed on rank 0 from a barrier
before entering ``distributed_commit`` to its exit (so: writes, every rank's
fsync and hashing of the tree, the collectives, marker, rename, root fsync).
Configurations alternate within each repetition; medians are reported,
with a plain single-process ``CheckpointDir.commit`` of the same bytes as the
reference.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from _harness import Stopwatch, settle
from _payloads import write_bytes


def rank_main(rank: int, world: int, paths: tuple[str, str, str], mb: int, commits: int) -> None:
    """One rank: ``commits`` timed commits of its share of ``mb``; ``paths``: init, root, out."""
    init, root, out = paths
    import torch.distributed as dist

    from atomic_ckpt import CheckpointDir
    from atomic_ckpt.distributed import distributed_commit, rank_path

    dist.init_process_group(
        "gloo",
        init_method=f"file://{init}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=120),
    )
    data = os.urandom(mb * 2**20 // world)
    ckpts = CheckpointDir(root)
    times = []
    for step in range(commits + 1):  # the first commit warms up (group creation)
        dist.barrier()
        with Stopwatch() as elapsed, distributed_commit(ckpts, step) as path:
            write_bytes(rank_path(path / "shard.bin", rank), data, fsync=False)
        if step:
            times.append(elapsed.seconds)
        if rank == 0:
            ckpts.prune(keep_last=1)
            settle()  # the deletion's writeback happens outside the timed region
    if rank == 0:
        Path(out).write_text(json.dumps(times))
    dist.destroy_process_group()


def run_ranks(world: int, tmp: Path, mb: int, commits: int) -> list[float]:
    root = tmp / f"w{world}"
    shutil.rmtree(root, ignore_errors=True)
    init = tmp / f"init-{world}-{time.monotonic_ns()}"
    out = tmp / f"times-{world}.json"
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(
            target=rank_main, args=(r, world, (str(init), str(root), str(out)), mb, commits)
        )
        for r in range(world)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        assert p.exitcode == 0, f"rank exited with {p.exitcode}"
    times: list[float] = json.loads(out.read_text())
    return times


def run_plain(tmp: Path, mb: int, commits: int) -> list[float]:
    from atomic_ckpt import CheckpointDir

    root = tmp / "plain"
    shutil.rmtree(root, ignore_errors=True)
    ckpts = CheckpointDir(root)
    data = os.urandom(mb * 2**20)
    times = []
    for step in range(commits):
        with Stopwatch() as elapsed, ckpts.commit(step) as path:
            write_bytes(path / "shard.bin", data, fsync=False)
        times.append(elapsed.seconds)
        ckpts.prune(keep_last=1)
        settle()  # as for the ranks: the deletion's writeback is not timed
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=256, help="total bytes per commit, in MB")
    ap.add_argument("--commits", type=int, default=3, help="timed commits per start")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.mb, args.commits, args.reps = 32, 2, 1
    configs = ["plain", "1 rank", "4 ranks"]
    times: dict[str, list[float]] = {c: [] for c in configs}
    with tempfile.TemporaryDirectory(prefix="multirank-", dir=args.data_dir) as d:
        tmp = Path(d)
        for rep in range(args.reps):
            for c in configs[rep % 3 :] + configs[: rep % 3]:
                if c == "plain":
                    times[c] += run_plain(tmp, args.mb, args.commits)
                else:
                    times[c] += run_ranks(int(c.split()[0]), tmp, args.mb, args.commits)
    print(
        f"{args.mb} MB per commit in total, {len(times['plain'])} commits each, cores: "
        f"{os.cpu_count()}"
    )
    print(f"{'config':<10}{'median s':>10}{'min s':>8}{'max s':>8}{'MB/s':>8}")
    for c in configs:
        med = statistics.median(times[c])
        print(f"{c:<10}{med:>10.3f}{min(times[c]):>8.3f}{max(times[c]):>8.3f}{args.mb / med:>8.0f}")
    r4 = statistics.median(times["4 ranks"]) / statistics.median(times["1 rank"])
    r1 = statistics.median(times["1 rank"]) / statistics.median(times["plain"])
    print(f"4-rank / 1-rank commit time: {r4:.2f}")
    print(f"1-rank distributed / plain commit time: {r1:.2f}")


if __name__ == "__main__":
    main()
