"""What durability costs: atomic_ckpt against the unsafe save, the durable floor and its peers.

Run ``python benchmarks/fsync_overhead.py`` (the full run, ~10 minutes) or with
``--quick`` (about a minute). The full run with no options is the one committed
table: it writes ``benchmarks/results/fsync_overhead.{md,json,png}`` (and
``_meta.json``, which records the command and the code's commit), the source of
the README's table; rerun exactly that command to refresh it. Runs narrowed with
any option that changes what is measured need ``--out DIR`` elsewhere (they are
refused without it, so that nothing overwrites the committed table with a partial
one). Every method saves the same in-memory tensors; each timed run covers the
whole save (writes included) into a fresh directory.
Methods alternate within each repetition (the order rotates), and the report
gives the median and the spread (min, max) of the runs.

Methods:

* ``unsafe``: the same files written, no fsync (what most training code does);
* ``floor``: the same writes plus an fsync of each file, one after another
  (the least any durable save can cost);
* ``atomic_ckpt``: a durable commit with the library's defaults, and variants
  (each checksum algorithm, no checksum, serial fsync, ``durable=False``);
* peers on the same tensors: ``torch.save`` to one file + fsync,
  ``safetensors.torch.save_file`` + fsync, ``torch.distributed.checkpoint.save``
  with ``FileSystemWriter(sync_files=True)`` (one process, no process group).

Between runs the data is deleted, ``sync`` runs, and (as root) the clean page
cache is dropped, which also keeps ext4's recently-deleted-inode check from
slowing the next run's file creation. Writes go to ``--data-dir`` (default
``benchmarks/results/tmp``), which must be on the filesystem you care about.

Outputs in ``--out`` (default ``benchmarks/results``): ``fsync_overhead.md``
(table), ``fsync_overhead.json`` (a list of rows), ``fsync_overhead_meta.json``
(machine, settings, fsync counts, peak memory) and ``fsync_overhead.png``
(each method's median time relative to ``floor``).

This file holds the command line and the tables of cases and methods; what
gets written is in ``_payloads.py``, how runs are settled, timed and counted
in ``_harness.py``, the report in ``_report.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import inspect
import os
import shutil
import sys
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a checkout without installing

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from _harness import (  # noqa: E402
    Case,
    GiB,
    KiB,
    Method,
    MiB,
    Result,
    Settler,
    busy,
    filesystem,
    fsync_latency,
    loadavg,
    log,
    machine,
    machine_line,
    run_case,
)
from _payloads import FilesPayload, Payload, StatePayload, fsync_path  # noqa: E402
from _report import load, render, rows_of, write  # noqa: E402
from atomic_ckpt import CheckpointDir  # noqa: E402

# ---------------------------------------------------------------------- methods


def _unsafe(payload: Payload, target: Path) -> None:
    target.mkdir()
    payload.write(target, fsync=False)


def _floor(payload: Payload, target: Path) -> None:
    target.mkdir()
    payload.write(target, fsync=True)


def _torch_save(payload: Payload, target: Path) -> None:
    target.mkdir()
    with open(target / "state.pt", "wb") as f:
        torch.save(payload.torch_state(), f)
        f.flush()
        os.fsync(f.fileno())


def _safetensors_save(payload: Payload, target: Path) -> None:
    target.mkdir()
    path = target / "state.safetensors"
    save_file(payload.tensors(), str(path))
    fsync_path(path)


def _dcp_save(payload: Payload, target: Path) -> None:
    import torch.distributed.checkpoint as dcp

    writer = dcp.FileSystemWriter(str(target), sync_files=True)
    dcp.save(payload.dcp_state(), storage_writer=writer)


def _atomic(name: str, note: str, **options: Any) -> Method[Payload]:
    """A commit into an existing root by ``CheckpointDir(root, **options)``."""

    def run(payload: Payload, target: Path) -> None:
        payload.commit(CheckpointDir(target, **options))

    return Method(name, run, note, existing_root=True)


def default_checksum() -> str | None:
    default = inspect.signature(CheckpointDir.__init__).parameters["checksum"].default
    return default if default is None or isinstance(default, str) else None


def methods() -> list[Method[Payload]]:
    default = default_checksum()
    out = [
        Method("unsafe", _unsafe, "same files, no fsync"),
        Method("floor", _floor, "same writes + fsync of each file"),
        _atomic("atomic_ckpt", f"durable commit, defaults (checksum={default})"),
    ]
    for algo in [None, "crc32", "xxh3_128", "sha256"]:
        if algo != default:
            out.append(_atomic(f"atomic_ckpt checksum={algo}", "durable", checksum=algo))
    out += [
        _atomic("atomic_ckpt serial", "defaults, one fsync at a time", workers=1),
        _atomic("atomic_ckpt durable=False", "atomic, no fsync", durable=False),
        Method("torch.save+fsync", _torch_save, "one file"),
        Method("safetensors+fsync", _safetensors_save, "one file"),
        Method("dcp sync_files", _dcp_save, "FileSystemWriter(sync_files=True)"),
    ]
    return out


# Whose peak memory is measured on the largest single-file case.
MEMORY_METHOD = _atomic("atomic_ckpt (defaults), write + commit", "")


def baseline_method(package: Path, checksum: str | None) -> Method[Payload]:
    """A durable commit by an older atomic_ckpt (to show what a change gained).

    ``package`` is the ``atomic_ckpt`` directory of another checkout, e.g.
    ``git worktree add /tmp/before 74eadb4`` then ``--baseline
    /tmp/before/atomic_ckpt --baseline-checksum crc32``. It is imported beside
    this one under another name, and only the public API every version has is
    used: ``with CheckpointDir(root, checksum=...).commit(1) as staging:``
    writing the case's files (a training state too, with the same writer, where
    the ``atomic_ckpt`` row calls ``atomic_ckpt.torch.save_state``).
    """
    import importlib.util

    name = "atomic_ckpt_before"
    spec = importlib.util.spec_from_file_location(
        name, package / "__init__.py", submodule_search_locations=[str(package)]
    )
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {package}: not a package directory")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its relative imports resolve under this name
    spec.loader.exec_module(module)
    before = module.CheckpointDir

    def run(payload: Payload, target: Path) -> None:
        payload.commit_plain(before(target, checksum=checksum))

    note = f"before: atomic_ckpt {module.__version__} from {package}, checksum={checksum}"
    return Method("atomic_ckpt before", run, note, existing_root=True)


# ---------------------------------------------------------------------- cases


def _tiny_cases(repeats: int) -> list[Case[Payload]]:
    return [
        Case("1 file of 4 KiB", lambda: FilesPayload("1 file of 4 KiB", 1, 4 * KiB), repeats),
        Case("20 files of 4 KiB", lambda: FilesPayload("20 files of 4 KiB", 20, 4 * KiB), repeats),
        Case(
            "training state (tiny)",
            lambda: StatePayload("training state (tiny)", 256, 32, 1),
            repeats,
        ),
    ]


def _cases(quick: bool, repeats: int | None) -> list[Case[Payload]]:
    r = repeats or 3
    full = repeats is None and not quick  # cheap cases get more runs: their noise is larger
    big = 256 * MiB if quick else GiB
    big_name = "1 file of 256 MiB" if quick else "1 file of 1 GiB"
    state = (
        ("training state ~40 MB (quick)", 8000, 256, 4)
        if quick
        else ("training state ~250 MB + Adam", 16000, 768, 6)
    )
    return [
        # The small cases' fixed cost (a millisecond or two) needs many runs to settle;
        # they are cheap. The large ones are dominated by the disk and settle sooner.
        Case("1 file of 1 MiB", lambda: FilesPayload("1 file of 1 MiB", 1, MiB), 41 if full else r),
        Case(
            "1 file of 64 MiB",
            lambda: FilesPayload("1 file of 64 MiB", 1, 64 * MiB),
            21 if full else r,
        ),
        Case(big_name, lambda: FilesPayload(big_name, 1, big), 7 if full else r),
        Case(
            "1,000 files of 64 KiB",
            lambda: FilesPayload("1,000 files of 64 KiB", 1000, 64 * KiB),
            9 if full else r,
        ),
        Case(state[0], lambda: StatePayload(*state), 9 if full else r),
    ]


# ---------------------------------------------------------------------- main

DEFAULT_COMMAND = "python benchmarks/fsync_overhead.py"
"""The command of the committed table (no options): what the README's table comes from."""


def code_version() -> str:
    """The checkout's commit (``+ changes`` if atomic_ckpt/ or benchmarks/ differ from it)."""
    import subprocess

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *args], cwd=HERE.parent, capture_output=True, text=True, check=False
        )
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short=12", "HEAD")
    if not commit:
        return "unknown (not a git checkout)"
    dirty = git("status", "--porcelain", "--", "atomic_ckpt", "benchmarks")
    return commit + (" + uncommitted changes" if dirty else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="small cases, 3 runs (~1 minute)")
    size.add_argument("--tiny", action="store_true", help="KiB-sized cases (for the test suite)")
    parser.add_argument("--repeats", type=int, help="timed runs per method and case")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output directory (default: benchmarks/results, for the full default run only)",
    )
    parser.add_argument(
        "--data-dir", type=Path, default=None, help="where saves are written (default: OUT/tmp)"
    )
    parser.add_argument("--cases", help="comma-separated substrings selecting cases")
    parser.add_argument("--methods", help="comma-separated method names (unsafe and floor stay)")
    parser.add_argument(
        "--no-drop-caches", action="store_true", help="only sync between runs (no drop_caches)"
    )
    parser.add_argument("--no-chart", action="store_true", help="skip the PNG")
    parser.add_argument(
        "--busy",
        type=int,
        default=0,
        help="keep N CPU-bound processes running (like a trainer's data-loader workers)",
    )
    parser.add_argument(
        "--render", action="store_true", help="only re-render the table and chart from OUT/*.json"
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        metavar="PACKAGE_DIR",
        help="an older checkout's atomic_ckpt/ directory to compare against",
    )
    parser.add_argument(
        "--baseline-checksum", default="crc32", help="checksum for --baseline (or 'none')"
    )
    args = parser.parse_args(argv)

    committed = HERE / "results"
    narrowed = [
        flag
        for flag, value in (
            ("--quick", args.quick),
            ("--tiny", args.tiny),
            ("--repeats", args.repeats),
            ("--cases", args.cases),
            ("--methods", args.methods),
            ("--no-drop-caches", args.no_drop_caches),
            ("--busy", args.busy),
            ("--baseline", args.baseline),
            ("--no-chart", args.no_chart and not args.render),
        )
        if value
    ]
    if narrowed and not args.render and (args.out is None or args.out.resolve() == committed):
        parser.error(
            f"{', '.join(narrowed)} {'changes' if len(narrowed) == 1 else 'change'} what is "
            "measured: pass --out DIR (the committed "
            f"table in {committed} is the full run's, `{DEFAULT_COMMAND}`)"
        )
    out: Path = args.out or committed
    if args.render:
        render(out, *load(out), chart=not args.no_chart)
        return 0
    work_parent: Path = args.data_dir or out / "tmp"
    work = work_parent / f"fsync_overhead-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    work.mkdir(parents=True)
    out.mkdir(parents=True, exist_ok=True)

    cases = _tiny_cases(args.repeats or 2) if args.tiny else _cases(args.quick, args.repeats)
    if args.cases:
        wanted = [w.strip() for w in args.cases.split(",")]
        cases = [c for c in cases if any(w in c.name for w in wanted)]
    meths = methods()
    if args.baseline:
        algo = None if args.baseline_checksum.lower() == "none" else args.baseline_checksum
        meths.insert(3, baseline_method(args.baseline.resolve(), algo))
    if args.methods:
        keep = {"unsafe", "floor", *(w.strip() for w in args.methods.split(","))}
        meths = [m for m in meths if m.name in keep]
    settle = Settler(not args.no_drop_caches)

    warnings.filterwarnings("ignore", module="torch.distributed")
    code = code_version()  # at the start: the code that runs
    info = machine()
    info["filesystem"] = filesystem(work)
    results: list[Result] = []
    memory: list[dict[str, Any]] = []
    started = time.time()
    try:
        with busy(args.busy):
            latency = fsync_latency(work, settle)
            singles = [c for c in cases if c.name.startswith("1 file of")]
            for case in cases:
                log(f"case {case.name}: {len(meths)} methods x {case.repeats} runs")
                big = bool(singles) and case is singles[-1]
                res, mem = run_case(
                    case, meths, work, settle, memory=MEMORY_METHOD if big else None
                )
                results += res
                if mem is not None:
                    memory.append(mem)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        with contextlib.suppress(OSError):
            work_parent.rmdir()  # only if empty

    rows = rows_of(results, meths)
    meta = {
        "code": code,
        "machine": info,
        "machine_line": machine_line(info),
        "command": " ".join([DEFAULT_COMMAND, *(argv if argv is not None else sys.argv[1:])]),
        "finished": datetime.datetime.now().isoformat(timespec="seconds"),
        "duration_s": time.time() - started,
        "settle": "sync before each run"
        + (", clean page cache dropped before each case" if settle.drop else "")
        + "; methods alternate, order rotating per repetition",
        "default_checksum": default_checksum(),
        "busy_processes": args.busy,
        "memory": memory,
        "fsync_latency": latency,
        "loadavg_end": loadavg(),
    }
    report = write(out, rows, meta, chart=not args.no_chart)
    log(f"wrote {out}/fsync_overhead.{{md,json,png}} in {time.time() - started:.0f} s")
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
