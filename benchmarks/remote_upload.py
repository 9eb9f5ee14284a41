"""What the object-store commit protocol costs over a plain upload of the same files.

Run ``python benchmarks/remote_upload.py`` (the ~250 MB training state and 1,000 files
of 64 KiB, 5 repetitions, a few minutes) or ``--tiny`` (seconds; the smoke test).
Each case's files are written to local disk once; then, against a moto S3 server on
127.0.0.1 (a child process), each repetition times, in rotating order:

* ``s3fs.put``: ``S3FileSystem.put(tree, prefix, recursive=True)``, s3fs's defaults (an
  unsafe upload: no manifest, no checks, a crash leaves a partial tree that looks whole);
* ``atomic_ckpt commit``: ``RemoteCheckpointDir.upload(step, tree)``, the whole protocol:
  hash every file, read the step's manifest, upload under a fresh attempt (multipart with
  per-part CRC-32 for large files), list and check the attempt, write the manifest with
  a conditional PutObject. The store's one-time probe of conditional writes is run
  before the timed runs (once per process in real use);
* ``same uploads, no protocol``: the commit's upload step alone (the same parallel and
  multipart uploads, no hashing, no manifest GET, no listing, no manifest PUT), so that
  commit / this is the protocol's own cost.

Each run uploads to a fresh prefix, deleted (untimed) after it. Reported: the median
of the runs, its throughput, and the ratio commit / put (target: at most 1.1), plus the
ratio within each repetition (paired), steadier when other work shares the machine.
Outputs in ``--out`` (default ``benchmarks/results``): ``remote_upload.md`` and
``remote_upload.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a checkout without installing

from _harness import filesystem, loadavg, machine, machine_line  # noqa: E402
from _remote_payloads import KiB, RandomFiles, Tree, training_state  # noqa: E402
from _remote_server import moto_server  # noqa: E402
from atomic_ckpt.remote._store import Upload  # noqa: E402

METHODS = ("s3fs.put", "atomic_ckpt commit", "same uploads, no protocol")
TARGET = 1.1


def _cases(tiny: bool) -> list[Callable[[], Tree]]:
    if tiny:  # no torch: the smoke test stays quick
        return [
            lambda: RandomFiles("3 files of 64 KiB", 3, 64 * KiB),
            lambda: RandomFiles("20 files of 4 KiB", 20, 4 * KiB),
        ]
    return [
        lambda: training_state("training state ~250 MB + Adam", 16000, 768, 6),
        lambda: RandomFiles("1,000 files of 64 KiB", 1000, 64 * KiB),
    ]


def _tree_bytes(tree: Path) -> tuple[int, int]:
    files = [p for p in tree.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def run_case(payload: Tree, endpoint: str, data_dir: Path, repeats: int) -> dict[str, Any]:
    """Time both methods ``repeats`` times on ``payload``'s files; one result row."""
    import s3fs

    from atomic_ckpt.remote import RemoteCheckpointDir

    tree = data_dir / "tree"
    shutil.rmtree(tree, ignore_errors=True)
    tree.mkdir(parents=True)
    payload.write(tree, fsync=False)
    nfiles, nbytes = _tree_bytes(tree)
    bucket = f"bench-{int(time.time() * 1000)}"
    options = {"endpoint_url": endpoint, "skip_instance_cache": True}
    fs = s3fs.S3FileSystem(**options)
    fs.mkdir(bucket)
    rdir = RemoteCheckpointDir(
        f"s3://{bucket}/commit", storage_options=options, staging_dir=data_dir / "staging"
    )
    rdir.check_conditional_writes()
    runs: dict[str, list[float]] = {m: [] for m in METHODS}
    paired: list[float] = []
    paired_raw: list[float] = []

    def put(i: int) -> None:
        fs.put(str(tree) + "/", f"{bucket}/put-{i}/", recursive=True)

    def commit(i: int) -> None:
        rdir.upload(i, tree)

    files = sorted(p for p in tree.rglob("*") if p.is_file())

    def uploads_only(i: int) -> None:
        # The commit's own upload step alone (private API: a measurement, not a use):
        # what the protocol costs on top of it is hashing, a GET, a LIST and a PUT.
        rdir._store.upload(
            [Upload(p, f"raw-{i}/{p.relative_to(tree)}", p.stat().st_size) for p in files]
        )

    timed = {"s3fs.put": put, "atomic_ckpt commit": commit, METHODS[2]: uploads_only}
    for i in range(repeats + 1):  # the first repetition warms up, untimed
        order = METHODS[i % 3 :] + METHODS[: i % 3]  # the order rotates
        times: dict[str, float] = {}
        for method in order:
            start = time.perf_counter()
            timed[method](i)
            times[method] = time.perf_counter() - start
        fs.rm(f"{bucket}/put-{i}", recursive=True)
        fs.rm(f"{bucket}/commit/raw-{i}", recursive=True)
        rdir.delete(i)
        if i == 0:
            continue
        for method, seconds in times.items():
            runs[method].append(seconds)
        paired.append(times["atomic_ckpt commit"] / times["s3fs.put"])
        paired_raw.append(times["atomic_ckpt commit"] / times[METHODS[2]])
    put_s = statistics.median(runs["s3fs.put"])
    commit_s = statistics.median(runs["atomic_ckpt commit"])
    raw_s = statistics.median(runs[METHODS[2]])
    return {
        "case": payload.name,
        "files": nfiles,
        "bytes": nbytes,
        "repeats": repeats,
        "runs": runs,
        "median_s": {"s3fs.put": put_s, "atomic_ckpt commit": commit_s, METHODS[2]: raw_s},
        "mb_per_s": {m: nbytes / statistics.median(runs[m]) / 1e6 for m in METHODS},
        "ratio": commit_s / put_s,
        "ratio_paired": statistics.median(paired),
        "ratio_best": min(runs["atomic_ckpt commit"]) / min(runs["s3fs.put"]),
        "protocol_ratio": commit_s / raw_s,
        "protocol_ratio_paired": statistics.median(paired_raw),
    }


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The report: machine and versions, the run, one row per case."""
    lines = [
        "# Object-store commit vs plain upload (`benchmarks/remote_upload.py`)",
        "",
        f"Machine: {meta['machine_line']}.",
        "",
        f"Server and client: moto {meta['versions']['moto']} (server mode, a child process "
        f"on 127.0.0.1), s3fs {meta['versions']['s3fs']}, boto3 {meta['versions']['boto3']}, "
        f"botocore {meta['versions']['botocore']}, aiobotocore {meta['versions']['aiobotocore']}"
        f". Local files on {meta['filesystem']}.",
        "",
        f"Load average at the end of the run: {', '.join(meta['loadavg'])} (other work may "
        "share the machine: compare the two methods within a case, not across runs).",
        "",
        f"Run: {meta['started']}, `{meta['command']}`; {meta['repeats']} timed repetitions "
        "after one untimed warm-up, the methods' order rotating; medians. "
        "The third method is the commit's own upload step alone (no hashing, manifest GET, "
        "listing or manifest PUT): commit / that is what the protocol itself costs. "
        "ratio = median commit / median put; (paired) = median over repetitions of the ratio "
        "within one repetition; (best) = fastest commit / fastest put. Target: ratio <= "
        f"{TARGET}.",
        "",
        "| case | files | size | s3fs.put | MB/s | atomic_ckpt commit | MB/s | ratio | "
        "(paired) | (best) | within target | same uploads, no protocol | commit / that "
        "(paired) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        put, com = r["median_s"]["s3fs.put"], r["median_s"]["atomic_ckpt commit"]
        ok = "yes" if min(r["ratio"], r["ratio_paired"]) <= TARGET else "**no**"
        lines.append(
            f"| {r['case']} | {r['files']:,} | {_size(r['bytes'])} | {put:.3f} s | "
            f"{r['mb_per_s']['s3fs.put']:.0f} | {com:.3f} s | "
            f"{r['mb_per_s']['atomic_ckpt commit']:.0f} | {r['ratio']:.3f} | "
            f"{r['ratio_paired']:.3f} | {r['ratio_best']:.3f} | {ok} | "
            f"{r['median_s'][METHODS[2]]:.3f} s | {r['protocol_ratio']:.3f} "
            f"({r['protocol_ratio_paired']:.3f}) |"
        )
    lines += [
        "",
        "What the commit does beyond the put, per checkpoint: hashes every file (xxh3-128, "
        "recorded in the manifest), one GET (the step's manifest), one LIST of the attempt "
        "(the listing check), one conditional PUT (the manifest). How each uploads: "
        "`s3fs.put` with s3fs's defaults (files in concurrent batches; a file of 100 MiB or "
        "more as a multipart upload of 50 MiB parts, up to 10 at once); the commit with up "
        "to 16 requests in flight (files and parts alike; a file of 64 MiB or more in 32 MiB "
        "parts, each with its CRC-32). Both share botocore's default pool of 10 connections.",
        "",
    ]
    return "\n".join(lines)


def _tiny_machine() -> dict[str, Any]:
    """``machine()`` without importing torch (which --tiny does not use)."""
    import platform

    import atomic_ckpt

    ram = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram = int(line.split()[1]) * 1024
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_bytes": ram,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "torch": "not used",
        "atomic_ckpt": atomic_ckpt.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="tiny payloads (the smoke test)")
    p.add_argument("--repeats", type=int, default=None, help="timed repetitions (default 5)")
    p.add_argument("--out", type=Path, default=HERE / "results", help="where results go")
    p.add_argument("--data-dir", type=Path, default=None, help="local files (default: a temp dir)")
    args = p.parse_args(argv)
    repeats = args.repeats or (1 if args.tiny else 5)
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="remote_upload-"))
    data_dir.mkdir(parents=True, exist_ok=True)
    started = datetime.datetime.now().isoformat(timespec="seconds")
    rows = []
    try:
        with moto_server() as endpoint:
            for make in _cases(args.tiny):
                payload = make()
                print(f"{payload.name} ...", file=sys.stderr, flush=True)
                row = run_case(payload, endpoint, data_dir, repeats)
                print(
                    f"  put {row['median_s']['s3fs.put']:.3f} s, commit "
                    f"{row['median_s']['atomic_ckpt commit']:.3f} s, ratio {row['ratio']:.3f}",
                    file=sys.stderr,
                    flush=True,
                )
                rows.append(row)
    finally:
        if args.data_dir is None:
            shutil.rmtree(data_dir, ignore_errors=True)
    info = _tiny_machine() if args.tiny else machine()
    info["filesystem"] = filesystem(args.data_dir or Path(tempfile.gettempdir()))
    meta = {
        "machine": info,
        "machine_line": machine_line(info),
        "filesystem": info["filesystem"],
        "loadavg": loadavg(),
        "started": started,
        "command": " ".join(["python", "benchmarks/remote_upload.py", *(argv or sys.argv[1:])]),
        "repeats": repeats,
        "versions": {
            name: version(name) for name in ("moto", "s3fs", "boto3", "botocore", "aiobotocore")
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "remote_upload.json").write_text(
        json.dumps({"rows": rows, "meta": meta}, indent=1) + "\n"
    )
    (args.out / "remote_upload.md").write_text(markdown(rows, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
