"""Reading at scale: how latest(), steps(), get(), verify() and `atomic-ckpt ls` grow.

Run ``python benchmarks/scan_scale.py`` (full: a few minutes) or with ``--quick``
(under a minute; ``--tiny`` is the test suite's smoke run). Four parts:

1. **The grid**: roots of 1, 10, 100 and 1,000 checkpoints of 1, 1,000 and 10,000
   files each; ``latest()``, ``steps()``, ``get()`` and ``ls`` timed on each
   (warm page cache, median of the repetitions; with ``--cold`` also after
   dropping the page cache), ``verify()`` on each files-per-checkpoint size.
   Ten million real files are more than this machine should write, so each
   checkpoint is made by the library (a commit of a one-file directory with
   ``durable=False``) and its marker then rewritten by the library's own writer
   (``Manifest.to_bytes``) to list N synthetic files: a genuine marker of an
   N-file checkpoint whose files are not on disk. Only the checkpoints that
   ``verify()`` reads hold their N files for real (the newest of each
   one-checkpoint root). Nothing timed here reads the listed files except verify.
2. **Before and after** (issue 15): 200 checkpoints of 1,000 files, with
   version-1 markers (written by a copy of the 0.1.0 writer) read by the old
   code (``--before DIR``, a checkout of commit 9989c83, run in a child
   process) and by this one, and with version-2 markers read by this one.
3. **verify() against a plain parallel read** of the same files (the same
   number of threads, one reused 1 MiB buffer each), with a cold page cache
   (``sync`` and ``echo 3 > /proc/sys/vm/drop_caches`` before every run, as
   root): 1 file of 1 GiB and 1,000 files of 64 KiB. The two alternate.
4. **One manifest of 100,000 files**: marker size per file and parse times,
   version 1 against version 2.

Outputs in ``--out`` (default ``benchmarks/results``): ``scan_scale.md`` (the
tables) and ``scan_scale.json`` (every figure, with the machine line). Data goes
to ``--data-dir`` (default ``benchmarks/results/tmp/scan``), deleted at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import io
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
_CHILD = "--child" in sys.argv
if not _CHILD:
    sys.path.insert(0, str(HERE.parent))  # run from a checkout without installing

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
DROP_CACHES = Path("/proc/sys/vm/drop_caches")

GRIDS = {
    "full": {"counts": [1, 10, 100, 1000], "files": [1, 1000, 10000]},
    "quick": {"counts": [1, 10, 100], "files": [1, 1000]},
    "tiny": {"counts": [1, 3], "files": [1, 10]},
}
BEFORE_AFTER = {"full": (200, 1000), "quick": (200, 1000), "tiny": (5, 20)}
VERIFY_CASES = {
    "full": [("1 file of 1 GiB", 1, GiB), ("1,000 files of 64 KiB", 1000, 64 * KiB)],
    "quick": [("1 file of 256 MiB", 1, 256 * MiB), ("1,000 files of 64 KiB", 1000, 64 * KiB)],
    "tiny": [("1 file of 1 MiB", 1, MiB), ("20 files of 4 KiB", 20, 4 * KiB)],
}
MANIFEST_FILES = {"full": 100_000, "quick": 100_000, "tiny": 1000}


def log(msg: str) -> None:
    """A timestamped progress line on stderr (stdout carries the report)."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- timing


def median_time(
    fn: Callable[[], object], repeats: int, before: Callable[[], None] | None = None
) -> float:
    """Median wall-clock seconds of ``repeats`` calls of ``fn`` (``before`` untimed, each time)."""
    runs = []
    for _ in range(repeats):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def can_drop_caches() -> bool:
    return os.access(DROP_CACHES, os.W_OK)


def drop_caches() -> None:
    """Write back everything dirty, then drop the page cache, dentries and inodes."""
    os.sync()
    DROP_CACHES.write_text("3\n")


# ---------------------------------------------------------------- the timed calls (either library)


def measure_root(root: Path, step: int, repeats: int, cold: bool) -> dict[str, float]:
    """latest(), steps(), get(step) and `ls` on ``root`` with whichever atomic_ckpt is imported.

    Only public API that 0.1.0 already had, so the old code runs this too.
    """
    from atomic_ckpt import CheckpointDir
    from atomic_ckpt.cli import main

    ckpts = CheckpointDir(root)
    latest = ckpts.latest()
    assert latest is not None
    assert ckpts.get(step).step == step

    def ls() -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["ls", str(root)]) == 0

    out = {
        "latest_s": median_time(ckpts.latest, max(repeats, 5)),
        "steps_s": median_time(ckpts.steps, repeats),
        "get_s": median_time(lambda: ckpts.get(step), max(repeats, 5)),
        "ls_s": median_time(ls, repeats),
    }
    if cold:
        cold_repeats = max(1, min(repeats, 3))
        out["latest_cold_s"] = median_time(ckpts.latest, cold_repeats, drop_caches)
        out["steps_cold_s"] = median_time(ckpts.steps, cold_repeats, drop_caches)
    return out


def measure_parse(marker: Path, repeats: int) -> dict[str, float]:
    """Seconds to judge one marker's bytes (``from_bytes``: a version-2 header only) and to
    parse its whole file list, whichever atomic_ckpt is imported."""
    from atomic_ckpt import Manifest

    data = marker.read_bytes()
    return {
        "judge_s": median_time(lambda: Manifest.from_bytes(data), max(repeats, 5)),
        "files_s": median_time(lambda: Manifest.from_bytes(data).files, repeats),
    }


def child_main(request: dict[str, Any]) -> None:
    """``--child``: run one measurement with the library at ``request["lib"]``, print JSON."""
    sys.path.insert(0, request["lib"])
    import atomic_ckpt

    assert Path(atomic_ckpt.__file__).resolve().is_relative_to(Path(request["lib"]).resolve())
    if request["op"] == "root":
        result: Any = measure_root(
            Path(request["root"]), request["step"], request["repeats"], request["cold"]
        )
    else:
        result = measure_parse(Path(request["marker"]), request["repeats"])
    print(json.dumps({"version": atomic_ckpt.__version__, "result": result}))


def in_child(lib: Path, request: dict[str, Any]) -> Any:
    """Run a measurement in a fresh interpreter with the library at ``lib``: the old code
    cannot share a process with this one, and a fresh heap keeps both sides equal (a
    big heap makes the garbage collector slow every parse down)."""
    proc = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps({**request, "lib": str(lib)})],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout)["result"]


def measure_after(root: Path, step: int, repeats: int, cold: bool) -> dict[str, float]:
    """:func:`measure_root` with this checkout's library, in a fresh interpreter."""
    request = {"op": "root", "root": str(root), "step": step, "repeats": repeats, "cold": cold}
    result: dict[str, float] = in_child(HERE.parent, request)
    return result


# ---------------------------------------------------------------- building roots


def synthetic_entries(n: int, seed: int = 15) -> tuple[Any, ...]:
    """``n`` file entries shaped like a sharded checkpoint's (paths, sizes, xxh3 digests)."""
    from atomic_ckpt import FileEntry

    rng = random.Random(seed)
    return tuple(
        FileEntry(
            f"model/layer_{i // 100:03d}/shard_{i:05d}.distcp",
            "file",
            size=rng.randrange(1 << 20, 1 << 28),
            checksum=f"{rng.getrandbits(128):032x}",
        )
        for i in range(n)
    )


def v1_marker(manifest: Any) -> bytes:
    """A version-1 marker: ``Manifest.to_bytes`` as 0.1.0 wrote it (commit 9989c83)."""
    doc = {
        "format": "atomic_ckpt",
        "version": 1,
        "step": manifest.step,
        "created": manifest.created,
        "library_version": manifest.library_version,
        "checksum": manifest.checksum,
        "metadata": dict(manifest.metadata),
        "files": [e.to_json() for e in manifest.files],
    }
    return (json.dumps(doc, indent=1, allow_nan=False) + "\n").encode()


def build_root(root: Path, count: int, entries: tuple[Any, ...], *, version: int = 2) -> None:
    """``count`` checkpoints (steps 0..count-1), each committed by the library and its marker
    rewritten to list ``entries`` (synthetic: not on disk)."""
    from atomic_ckpt import MARKER, CheckpointDir, Manifest

    ckpts = CheckpointDir(root, durable=False)
    for step in range(count):
        with ckpts.commit(step) as path:
            (path / "placeholder.bin").write_bytes(b"x")
        real = ckpts.get(step).manifest
        synthetic = Manifest(
            step=step,
            files=entries,
            created=real.created,
            library_version=real.library_version,
            checksum=real.checksum,
            metadata={"loss": 1.0 / (step + 1)},
        )
        data = synthetic.to_bytes() if version == 2 else v1_marker(synthetic)
        (ckpts.path_of(step) / MARKER).write_bytes(data)
        (ckpts.path_of(step) / "placeholder.bin").unlink()


def commit_real(root: Path, step: int, n: int, size: int) -> Path:
    """A checkpoint of ``n`` real files of ``size`` random bytes (``durable=False``)."""
    from atomic_ckpt import CheckpointDir

    ckpts = CheckpointDir(root, durable=False)
    block = os.urandom(min(size, 8 * MiB))
    with ckpts.commit(step) as path:
        for i in range(n):
            with open(path / f"part_{i:05d}.bin", "wb") as f:
                left = size
                while left:
                    f.write(block[: min(left, len(block))])
                    left -= min(left, len(block))
    os.sync()
    return ckpts.path_of(step)


# ---------------------------------------------------------------- the four parts


def run_grid(
    work: Path, grid: dict[str, list[int]], repeats: int, cold: bool
) -> list[dict[str, Any]]:
    from atomic_ckpt import CheckpointDir

    rows = []
    for files in grid["files"]:
        entries = synthetic_entries(files)
        verify_s = None
        for count in grid["counts"]:
            root = work / f"grid-{count}x{files}"
            t0 = time.perf_counter()
            if count == 1:  # the one checkpoint verify reads holds its files for real
                commit_real(root, 0, files, 4 * KiB)
            else:
                build_root(root, count - 1, entries)
                commit_real(root, count - 1, files, 4 * KiB)  # the newest: real
            log(f"grid {count} x {files}: built in {time.perf_counter() - t0:.1f} s")
            row: dict[str, Any] = {"checkpoints": count, "files": files}
            # Cold runs (page cache dropped before each) only for the most checkpoints.
            row.update(
                measure_after(root, count // 2, repeats, cold and count == grid["counts"][-1])
            )
            if count == 1:
                verify_s = median_time(functools.partial(CheckpointDir(root).verify, 0), repeats)
            row["verify_s"] = verify_s
            row["marker_bytes"] = (root / str(count // 2) / "checkpoint_complete").stat().st_size
            rows.append(row)
            log(
                f"  latest {row['latest_s'] * 1e3:.2f} ms, steps {row['steps_s'] * 1e3:.1f} ms, "
                f"get {row['get_s'] * 1e3:.2f} ms, ls {row['ls_s'] * 1e3:.1f} ms"
            )
            shutil.rmtree(root)
    return rows


def run_before_after(
    work: Path, count: int, files: int, *, repeats: int, before: Path | None, cold: bool
) -> list[dict[str, Any]]:
    entries = synthetic_entries(files)
    step = count // 2
    out = []
    for version in (1, 2):
        root = work / f"ba-v{version}"
        build_root(root, count, entries, version=version)
        os.sync()
        if version == 1 and before is not None:
            result = in_child(
                before,
                {"op": "root", "root": str(root), "step": step, "repeats": repeats, "cold": cold},
            )
            out.append({"code": "before (9989c83)", "markers": "version 1", **result})
            log(f"before, v1 markers: {result}")
        result = measure_after(root, step, repeats, cold)
        out.append({"code": "after", "markers": f"version {version}", **result})
        log(f"after, v{version} markers: {result}")
        size = (root / str(step) / "checkpoint_complete").stat().st_size
        for row in out:
            row.setdefault("marker_bytes", size)
        shutil.rmtree(root)
    return out


_local = threading.local()


def plain_read(top: Path, threads: int) -> None:
    """Every regular file under ``top`` (found by listing it, as ``cat`` would need to) read
    to the end on ``threads`` threads: the floor verify() is held to."""
    files: list[str] = []
    dirs = [os.fspath(top)]
    while dirs:
        with os.scandir(dirs.pop()) as it:
            for entry in it:
                if entry.is_dir(follow_symlinks=False):
                    dirs.append(entry.path)
                elif entry.is_file(follow_symlinks=False) and entry.name != "checkpoint_complete":
                    files.append(entry.path)
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(_read_whole, files))


def _read_whole(path: str) -> None:
    buf = getattr(_local, "buf", None)
    if buf is None:
        buf = _local.buf = bytearray(MiB)
    fd = os.open(path, os.O_RDONLY)
    try:
        while os.readv(fd, [buf]):
            pass
    finally:
        os.close(fd)


def run_verify(
    work: Path, cases: list[tuple[str, int, int]], repeats: int, cold: bool
) -> list[dict[str, Any]]:
    from atomic_ckpt import CheckpointDir

    rows = []
    for name, n, size in cases:
        root = work / "verify"
        path = commit_real(root, 1, n, size)
        ckpts = CheckpointDir(root)
        methods = {
            "verify": functools.partial(ckpts.verify, 1),
            "plain parallel read": functools.partial(plain_read, path, ckpts.workers),
        }
        runs: dict[str, list[float]] = {m: [] for m in methods}
        for m in methods.values():  # untimed: imports, first thread pools
            m()
        # Small cases are quick and noisier (other work shares the disk): more runs.
        for r in range(repeats if n * size >= 256 * MiB else 2 * repeats + 1):
            order = list(methods) if r % 2 == 0 else list(reversed(methods))
            for m in order:
                if cold:
                    drop_caches()
                t0 = time.perf_counter()
                methods[m]()
                runs[m].append(time.perf_counter() - t0)
        v, p = (statistics.median(runs[m]) for m in methods)
        paired = statistics.median(
            a / b for a, b in zip(runs["verify"], runs["plain parallel read"], strict=True)
        )
        row = {
            "case": name,
            "bytes": n * size,
            "threads": ckpts.workers,
            "cache": "cold" if cold else "warm",
            "verify_s": v,
            "plain_s": p,
            "ratio": v / p,
            "paired_ratio": paired,
            "best_ratio": min(runs["verify"]) / min(runs["plain parallel read"]),
            "verify_runs": runs["verify"],
            "plain_runs": runs["plain parallel read"],
        }
        rows.append(row)
        log(
            f"{name}: verify {v:.3f} s, plain {p:.3f} s, ratio {v / p:.3f} "
            f"(paired {paired:.3f}, best runs {row['best_ratio']:.3f})"
        )
        shutil.rmtree(root)
    return rows


def run_manifest(work: Path, n: int, repeats: int, before: Path | None) -> dict[str, Any]:
    from atomic_ckpt import Manifest

    entries = synthetic_entries(n)
    m = Manifest(
        step=1, files=entries, created=time.time(), library_version="x", checksum="xxh3_128"
    )
    v2 = m.to_bytes()
    v1 = v1_marker(m)
    out: dict[str, Any] = {
        "files": n,
        "v1_bytes_per_file": len(v1) / n,
        "v2_bytes_per_file": len(v2) / n,
        "v2_write_s": median_time(m.to_bytes, repeats),
    }
    for name, data in (("v1", v1), ("v2", v2)):
        marker = work / f"{name}-marker"
        marker.write_bytes(data)
        for code, lib in (("after", HERE.parent), ("before", before)):
            if lib is None or (code == "before" and name == "v2"):
                continue
            parsed = in_child(lib, {"op": "parse", "marker": str(marker), "repeats": repeats})
            out[f"{name}_judge_{code}_s"] = parsed["judge_s"]
            out[f"{name}_files_{code}_s"] = parsed["files_s"]
        marker.unlink()
    log(f"manifest of {n} files: {out}")
    return out


# ---------------------------------------------------------------- report


def _ms(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1e3:.1f} ms" if s >= 0.01 else f"{s * 1e3:.2f} ms"


def summary(report: dict[str, Any]) -> list[str]:
    rows = report["grid"]
    lines = []
    counts = sorted({r["checkpoints"] for r in rows})
    for files in sorted({r["files"] for r in rows}):
        by = {r["checkpoints"]: r for r in rows if r["files"] == files}
        lo, hi = by[counts[0]], by[counts[-1]]
        lines.append(
            f"* files per checkpoint {files:,}, checkpoints {counts[0]:,} -> {counts[-1]:,}: "
            f"latest() x{hi['latest_s'] / lo['latest_s']:.2f} ({_ms(lo['latest_s'])} -> "
            f"{_ms(hi['latest_s'])}), steps() x{hi['steps_s'] / lo['steps_s']:.0f} "
            f"({_ms(lo['steps_s'])} -> {_ms(hi['steps_s'])}), get() "
            f"{_ms(lo['get_s'])} -> {_ms(hi['get_s'])}, ls {_ms(lo['ls_s'])} -> {_ms(hi['ls_s'])}"
        )
    top = max(rows, key=lambda r: (r["checkpoints"], r["files"]))
    one = next(r for r in rows if r["checkpoints"] == counts[0] and r["files"] == top["files"])
    lines.append(
        f"* Targets: latest() on {top['checkpoints']:,} checkpoints / on {one['checkpoints']} = "
        f"{top['latest_s'] / one['latest_s']:.2f}x (target within 2x); steps() on "
        f"{top['checkpoints']:,} x {top['files']:,} files = {_ms(top['steps_s'])} "
        "(target under 1 s)."
    )
    for v in report["verify"]:
        lines.append(
            f"* verify() / plain parallel read, {v['case']} ({v['cache']} cache, "
            f"{v['threads']} threads): "
            f"{v['ratio']:.3f} (paired {v['paired_ratio']:.3f}, best runs "
            f"{v['best_ratio']:.3f}; target within 1.1)"
        )
    return lines


def markdown(report: dict[str, Any]) -> str:
    meta = report["run"]
    out = [
        "# Reading at scale (`benchmarks/scan_scale.py`)",
        "",
        f"Machine: {report['machine_line']}.",
        "",
        f"Load average at the end of the run: {', '.join(meta['loadavg'])} (other work may "
        "share the machine).",
        "",
        f"Run: {meta['started']}, `{meta['command']}`; {meta['repeats']} repetitions, medians; "
        "page cache warm unless marked cold"
        + (
            " (dropped before each cold run: the most checkpoints of the grid, before/after)."
            if meta["cold"]
            else " (no cold runs: --no-drop-caches, or not root)."
        ),
        "",
        "How the roots are made: each checkpoint is committed by the library (`durable=False`) "
        "and its marker then rewritten by the library's own writer (`Manifest.to_bytes`) to "
        "list N synthetic files, which are not on disk: a genuine marker of an N-file "
        "checkpoint. The newest checkpoint of each root holds its N files for real (4 KiB "
        "each), so that `verify()` (on the one-checkpoint roots) reads real files.",
        "",
        "## Summary",
        "",
        *summary(report),
        "",
        "## Before and after (issue 15)",
        "",
        "| code | markers | latest() | steps() | get() | ls | latest() cold | steps() cold "
        "| marker |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["before_after"]:
        out.append(
            f"| {r['code']} | {r['markers']} | {_ms(r['latest_s'])} | {_ms(r['steps_s'])} | "
            f"{_ms(r['get_s'])} | {_ms(r['ls_s'])} | {_ms(r.get('latest_cold_s'))} | "
            f"{_ms(r.get('steps_cold_s'))} | {r.get('marker_bytes', 0) / 1000:.0f} KB |"
        )
    count, files = meta["before_after"]
    out += [
        "",
        f"{count} checkpoints of {files:,} files each. Version-1 markers are what 0.1.0 "
        "wrote (kept readable, and parsed whole); a save with this code writes version 2.",
        "",
        "## The grid",
        "",
        "| checkpoints | files each | latest() | steps() | get() | ls | verify() "
        "| latest() cold | steps() cold | marker |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["grid"]:
        out.append(
            f"| {r['checkpoints']:,} | {r['files']:,} | {_ms(r['latest_s'])} | "
            f"{_ms(r['steps_s'])} | "
            f"{_ms(r['get_s'])} | {_ms(r['ls_s'])} | {_ms(r['verify_s'])} | "
            f"{_ms(r.get('latest_cold_s'))} | {_ms(r.get('steps_cold_s'))} | "
            f"{r['marker_bytes'] / 1000:.1f} KB |"
        )
    out += [
        "",
        "verify() is of the one real N-file checkpoint (4 KiB files, warm cache), the same in "
        "every row of a file count.",
        "",
        "## verify() against a plain parallel read of the same files",
        "",
        "| case | cache | threads | verify() | plain read | ratio | paired | best runs |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for v in report["verify"]:
        out.append(
            f"| {v['case']} | {v['cache']} | {v['threads']} | {_ms(v['verify_s'])} | "
            f"{_ms(v['plain_s'])} | {v['ratio']:.3f} | {v['paired_ratio']:.3f} | "
            f"{v['best_ratio']:.3f} |"
        )
    out += [
        "",
        "verify(): `CheckpointDir.verify(step)` with the default xxh3_128 checksums (reads the "
        "marker, walks the directory, reads and hashes every file it finds and compares them "
        "with the manifest). "
        "Plain read: the checkpoint's directory listed and its files read to the end on a "
        "thread pool of the same size, one reused 1 MiB buffer per thread. "
        "They alternate; before every run `sync` and the page cache, dentries and inodes are "
        "dropped (when cold). Ratio: of the medians; paired: the median of verify/plain within "
        "a repetition; best runs: fastest verify / fastest plain read (the steadiest when other "
        "work shares the disk).",
        "",
        "## One manifest of many files",
        "",
    ]
    m = report["manifest"]
    out += [
        "| | bytes per file | write | judged (`from_bytes`) | whole file list |",
        "|---|---:|---:|---:|---:|",
        f"| version 2 (now) | {m['v2_bytes_per_file']:.1f} | {_ms(m['v2_write_s'])} | "
        f"{_ms(m['v2_judge_after_s'])} | {_ms(m['v2_files_after_s'])} |",
        f"| version 1, read by this code | {m['v1_bytes_per_file']:.1f} | - | "
        f"{_ms(m['v1_judge_after_s'])} | {_ms(m['v1_files_after_s'])} |",
    ]
    if "v1_files_before_s" in m:
        out.append(
            f"| version 1, read by 9989c83 | {m['v1_bytes_per_file']:.1f} | - | "
            f"{_ms(m['v1_judge_before_s'])} | {_ms(m['v1_files_before_s'])} |"
        )
    out += [
        "",
        f"{m['files']:,} files (`model/layer_NNN/shard_NNNNN.distcp`, xxh3_128 digests). "
        "Judged: `Manifest.from_bytes` (what a scan checks: a version-2 header; a version-1 "
        "marker is parsed whole); whole file list: `from_bytes(...).files` (for version 2: "
        "body CRC-32, JSON, entry checks). Each in a fresh interpreter.",
        "",
    ]
    return "\n".join(out)


def machine_info(work: Path) -> tuple[dict[str, Any], str]:
    sys.path.insert(0, str(HERE))
    import _harness

    try:
        info = _harness.machine()
    except ImportError:  # no torch: the rest of the line still says what ran
        import platform

        import atomic_ckpt

        info = {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "ram_bytes": None,
            "kernel": platform.release(),
            "python": platform.python_version(),
            "torch": "-",
            "atomic_ckpt": atomic_ckpt.__version__,
        }
    info["filesystem"] = _harness.filesystem(work)
    return info, _harness.machine_line(info)


@contextlib.contextmanager
def workdir(path: Path) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    work = path / f"run-{os.getpid()}"
    work.mkdir()
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)
        with contextlib.suppress(OSError):
            path.rmdir()


def main() -> int:
    if _CHILD:
        child_main(json.loads(sys.argv[sys.argv.index("--child") + 1]))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="a small grid (under a minute)")
    size.add_argument("--tiny", action="store_true", help="the smoke test's run (seconds)")
    p.add_argument("--repeats", type=int, default=None, help="repetitions (default 7; quick 3)")
    p.add_argument("--before", type=Path, help="a checkout of the code before issue 15 (9989c83)")
    p.add_argument("--no-drop-caches", action="store_true", help="never drop the page cache")
    p.add_argument("--out", type=Path, default=HERE / "results", help="where results go")
    p.add_argument("--data-dir", type=Path, default=HERE / "results" / "tmp" / "scan")
    args = p.parse_args()
    mode = "tiny" if args.tiny else "quick" if args.quick else "full"
    repeats = args.repeats or (7 if mode == "full" else 3)
    cold = not args.no_drop_caches and can_drop_caches()
    if args.before is not None and not (args.before / "atomic_ckpt" / "__init__.py").exists():
        p.error(f"--before {args.before}: no atomic_ckpt package there")
    started = datetime.datetime.now().isoformat(timespec="seconds")
    with workdir(args.data_dir) as work:
        info, line = machine_info(work)
        log(f"{mode} run, {repeats} repetitions, cold runs: {cold}; {line}")
        count, files = BEFORE_AFTER[mode]
        report: dict[str, Any] = {
            "machine": info,
            "machine_line": line,
            "run": {
                "started": started,
                "command": "python benchmarks/scan_scale.py " + " ".join(sys.argv[1:]),
                "mode": mode,
                "repeats": repeats,
                "cold": cold,
                "before_after": [count, files],
            },
        }
        report["before_after"] = run_before_after(
            work, count, files, repeats=repeats, before=args.before, cold=cold
        )
        report["grid"] = run_grid(work, GRIDS[mode], repeats, cold)
        report["verify"] = run_verify(
            work,
            VERIFY_CASES[mode],
            max(repeats, (15 if mode == "full" else 7) if cold else 3),
            cold,
        )
        report["manifest"] = run_manifest(work, MANIFEST_FILES[mode], repeats, args.before)
    report["run"]["loadavg"] = Path("/proc/loadavg").read_text().split()[:3]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scan_scale.json").write_text(json.dumps(report, indent=1) + "\n")
    text = markdown(report)
    (args.out / "scan_scale.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
