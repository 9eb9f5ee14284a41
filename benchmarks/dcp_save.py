"""What an atomic, durable DCP save costs: AtomicWriter against DCP's own durable save.

Run ``python benchmarks/dcp_save.py`` (a few minutes; ``--tiny`` for a smoke run).
For 1, 2 and 4 ranks (gloo on CPU, one process each), the ranks hold one
training state (a transformer-like model of ~250 MB with its Adam state, so
~750 MB to write in all), sharded as FSDP would (each rank its share of the
tensors), and save it with each method, the methods alternating within each
repetition (the order rotates); each run is timed on rank 0 from a barrier to a
barrier after the save, into a fresh directory, after ``sync``:

* ``AtomicWriter``: ``dcp.save(state, storage_writer=AtomicWriter(ckpts, step))``
  (durable, atomic, with a manifest: xxh3 checksums by default);
* ``DCP sync_files``: ``dcp.save`` with ``FileSystemWriter(path, sync_files=True)``
  and the same ``thread_count`` (durable files, but not atomic, no directory fsync);
* ``torch.save``: each rank ``torch.save``-s its share of the tensors to one file
  and fsyncs it (no commit at all: the floor of a per-rank save);
* ``async`` (blocking): how long ``dcp.async_save(..., AtomicWriter(...))`` blocks
  the training loop (staging: a copy of the state into CPU memory), and its total
  time until the future is done; ``cached``: the same with
  ``cache_staged_state_dict=True`` (the copy goes into the previous save's buffers:
  no allocation, no page faults). Async saves use a gloo group of their own.

Writes go to ``--data-dir`` (default ``benchmarks/results/tmp``). Results:
``--out`` (default ``benchmarks/results``) gets ``dcp_save.md`` and
``dcp_save.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a checkout without installing
sys.path.insert(0, str(HERE))

METHODS = ("atomic", "dcp_sync", "torch_save", "async", "async_cached")
FULL_STATE = ("training state ~250 MB + Adam", 16000, 768, 6)
TINY_STATE = ("training state (tiny)", 256, 32, 1)


def rank_main(rank: int, world: int, args: dict[str, Any], out: str) -> None:
    """One rank: every method ``repeats`` times (after a warm-up round); rank 0 writes
    the timings to ``out``."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    from _payloads import StatePayload, fsync_path
    from atomic_ckpt import CheckpointDir
    from atomic_ckpt.dcp import AtomicWriter

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    data = Path(args["data_dir"]) / f"w{world}"
    dist.init_process_group(
        "gloo",
        init_method=f"file://{data}.init",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=600),
    )
    payload = StatePayload(*args["state"])
    flat = sorted(payload.tensors().items())
    # Sharded as FSDP would: each rank holds (and saves) its share of the one state.
    state = {k: v for i, (k, v) in enumerate(flat) if i % world == rank}
    del payload
    threads = args["thread_count"]
    atomic = CheckpointDir(data / "atomic")
    background = CheckpointDir(data / "async")
    cached = CheckpointDir(data / "async_cached")
    times: dict[str, list[float]] = {m: [] for m in METHODS}
    times["async_total"], times["async_cached_total"] = [], []
    save_group = dist.new_group(backend="gloo")  # async saves: a group of their own
    for rep in range(args["repeats"] + 1):  # round 0 warms up (groups, page cache, allocator)
        order = METHODS[rep % len(METHODS) :] + METHODS[: rep % len(METHODS)]
        for method in order:
            if rank == 0:
                os.sync()
            dist.barrier()
            start = time.perf_counter()
            if method == "atomic":
                dcp.save(state, storage_writer=AtomicWriter(atomic, rep, thread_count=threads))
            elif method == "dcp_sync":
                writer = FileSystemWriter(
                    data / "dcp" / str(rep), sync_files=True, thread_count=threads
                )
                dcp.save(state, storage_writer=writer)
            elif method == "torch_save":
                path = data / "torch" / str(rep) / f"rank{rank}.pt"
                path.parent.mkdir(parents=True, exist_ok=True)
                torch.save(state, path)
                fsync_path(path)
            else:
                cache = method == "async_cached"
                writer = AtomicWriter(
                    cached if cache else background,
                    rep,
                    thread_count=threads,
                    cache_staged_state_dict=cache,
                    process_group=save_group,
                )
                future = dcp.async_save(state, storage_writer=writer, process_group=save_group)
                blocked = time.perf_counter() - start
                future.result()  # type: ignore[union-attr]
            dist.barrier()
            elapsed = time.perf_counter() - start
            if rep:
                if method.startswith("async"):
                    times[method].append(blocked)
                    times[f"{method}_total"].append(elapsed)
                else:
                    times[method].append(elapsed)
        dist.barrier()
        if rank == 0:  # the next round writes into fresh directories
            for sub in ("atomic", "dcp", "torch", "async", "async_cached"):
                shutil.rmtree(data / sub, ignore_errors=True)
            os.sync()
        dist.barrier()
    if rank == 0:
        Path(out).write_text(json.dumps(times))
    dist.destroy_process_group()


def run_world(world: int, args: dict[str, Any], out_dir: Path) -> dict[str, list[float]]:
    """Start ``world`` ranks and return rank 0's timings."""
    ctx = mp.get_context("spawn")
    out = out_dir / f"w{world}.json"
    procs = [ctx.Process(target=rank_main, args=(r, world, args, str(out))) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    codes = [p.exitcode for p in procs]
    if codes != [0] * world:
        raise SystemExit(f"{world} ranks: exit codes {codes}")
    result: dict[str, list[float]] = json.loads(out.read_text())
    out.unlink()
    return result


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def paired(row: dict[str, Any]) -> float:
    """The median over repetitions of AtomicWriter / DCP sync_files within one repetition
    (steadier than the ratio of medians when the disk's speed drifts between rounds)."""
    runs = row["runs"]
    return median([a / d for a, d in zip(runs["atomic"], runs["dcp_sync"], strict=True)])


def table(rows: list[dict[str, Any]]) -> list[str]:
    head = (
        "| ranks | AtomicWriter | DCP sync_files | torch.save + fsync | "
        "**AtomicWriter / DCP sync_files** (medians; paired) | AtomicWriter / torch.save | "
        "async blocking (fresh copy) | async blocking (cached buffers) | "
        "**async blocking / sync** (fresh, cached) | async total (fresh, cached) |"
    )
    lines = [head, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        a = r["atomic"]
        lines.append(
            f"| {r['ranks']} | {a:.3f} s | {r['dcp_sync']:.3f} s | "
            f"{r['torch_save']:.3f} s | **{a / r['dcp_sync']:.2f}; {paired(r):.2f}** | "
            f"{a / r['torch_save']:.2f} | {r['async']:.3f} s | {r['async_cached']:.3f} s | "
            f"**{r['async'] / a:.2f}, {r['async_cached'] / a:.2f}** | "
            f"{r['async_total']:.3f} s, {r['async_cached_total']:.3f} s |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny state (smoke test)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ranks", default="1,2,4", help="rank counts, comma-separated")
    parser.add_argument("--thread-count", type=int, default=1, help="DCP's writer threads")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--data-dir", type=Path, default=HERE / "results" / "tmp")
    opts = parser.parse_args()

    from _harness import filesystem, loadavg, machine, machine_line

    worlds = [int(w) for w in opts.ranks.split(",")]
    data = opts.data_dir.resolve()
    data.mkdir(parents=True, exist_ok=True)
    opts.out.mkdir(parents=True, exist_ok=True)
    args = {
        "state": TINY_STATE if opts.tiny else FULL_STATE,
        "repeats": opts.repeats,
        "thread_count": opts.thread_count,
        "data_dir": str(data),
    }
    rows = []
    try:
        for world in worlds:
            print(f"{world} rank(s)...", file=sys.stderr, flush=True)
            times = run_world(world, args, data)
            row: dict[str, Any] = {"ranks": world, "runs": times}
            row.update({k: median(v) for k, v in times.items()})
            rows.append(row)
    finally:
        for world in worlds:
            shutil.rmtree(data / f"w{world}", ignore_errors=True)
            (data / f"w{world}.init").unlink(missing_ok=True)
        with_contents = any(data.iterdir())
        if not with_contents and data != opts.out:
            data.rmdir()
    info = machine()
    info["filesystem"] = filesystem(data.parent)
    command = "python benchmarks/dcp_save.py " + " ".join(sys.argv[1:])
    lines = [
        "# An atomic, durable DCP save against DCP's own (`benchmarks/dcp_save.py`)",
        "",
        f"Machine: {machine_line(info)}.",
        "",
        f"Load average at the end: {', '.join(loadavg())} (other work shared the machine).",
        "",
        f"Run: {datetime.datetime.now().isoformat(timespec='seconds')}, `{command.strip()}`; "
        f"state: {args['state'][0]}; thread_count={opts.thread_count}; each cell the median "
        f"of {opts.repeats} runs after a warm-up round, methods alternating; times on rank 0 "
        "from a barrier to a barrier after the save; `sync` before each run.",
        "",
        *table(rows),
        "",
        "Targets (issue 10): AtomicWriter / DCP sync_files <= 1.0 at every rank count; "
        "async blocking / sync <= 0.2.",
        "",
    ]
    text = "\n".join(lines)
    (opts.out / "dcp_save.md").write_text(text)
    (opts.out / "dcp_save.json").write_text(
        json.dumps({"machine": info, "command": command, "rows": rows}, indent=1) + "\n"
    )
    print(text)


if __name__ == "__main__":
    main()
