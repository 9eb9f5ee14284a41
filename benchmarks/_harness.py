"""How the benchmarks measure: settle the machine, time runs, count fsyncs, peak memory.

Shared by ``fsync_overhead.py``, ``async_stall.py`` and ``multirank.py`` (run
as scripts, so this is imported as the top-level module ``_harness``). Also
here: the loop that times every method of a case, and a description of the
machine and of the filesystem the runs write to. Nothing here imports torch
or atomic_ckpt at import time; ``machine()`` asks them for their versions.
"""

from __future__ import annotations

import contextlib
import gc
import os
import platform
import shutil
import stat
import statistics
import subprocess
import sys
import threading
import time
import tracemalloc
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import host_memory

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def log(msg: str) -> None:
    """A timestamped progress line on stderr (stdout carries the report)."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- settling


def settle() -> None:
    """Collect garbage and write back everything dirty, so no run pays for the last one.

    What survives the collection is frozen (``gc.freeze``: moved out of the collector's
    generations), so the next one walks only what was made since: with torch and the
    frameworks imported, every full collection of the whole heap took about 0.4 s, more
    than a small case's run, in each of a run's hundred settles."""
    gc.collect()
    gc.freeze()
    os.sync()


class Settler:
    """Brings the machine to the same state before every run: nothing dirty in the page cache.

    The clean page cache is dropped only between cases (``between_cases``), after
    the case's files are deleted in bulk: that also evicts the inode-table blocks
    ext4 (without a journal) consults to skip recently deleted inodes, which
    would otherwise slow the next case's file creation for a minute. Dropping
    it before every run would instead make every run re-read directory and
    inode blocks from disk, which a training job that saves every few minutes
    never does.
    """

    def __init__(self, drop_caches: bool) -> None:
        self.drop = drop_caches and os.access("/proc/sys/vm/drop_caches", os.W_OK)

    def __call__(self) -> None:
        settle()

    def between_cases(self) -> None:
        self()
        if self.drop:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("1\n")  # clean page cache only: dentries and inodes stay


def prefault(nbytes: int) -> None:
    """Touch ``nbytes`` of fresh memory and free it again, just before a timed run.

    On a VM whose balloon reports free pages to the host (this one), memory
    freed by the previous run's deletion is handed back and the next write
    faults every page cache page in again: a first-touch cost that made the
    same save take 0.3 s or 1.1 s at random. Re-touching it here makes every
    run start with memory the guest really has, as a long-running trainer does.
    """
    import numpy as np

    if nbytes >= 16 * MiB:
        buf = np.empty(min(nbytes, 4 * GiB), dtype=np.uint8)
        buf.fill(1)
        del buf


@contextlib.contextmanager
def busy(n: int) -> Iterator[None]:
    """Keep ``n`` CPU-bound processes running (like a trainer's data-loader workers)."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for proc in burners:
            proc.kill()
            proc.wait()


# ---------------------------------------------------------------------- measuring


class Stopwatch:
    """Wall-clock seconds spent inside its ``with`` blocks, summed over every entry."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._t0 = 0.0

    def __enter__(self) -> Stopwatch:
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds += time.perf_counter() - self._t0


@contextlib.contextmanager
def count_fsyncs() -> Iterator[dict[str, int]]:
    """Count every os.fsync in this process (the library's, the peers', the floor's)."""
    counts = {"files": 0, "dirs": 0}
    lock = threading.Lock()
    real = os.fsync

    def counting(fd: Any) -> None:
        fdn = fd if isinstance(fd, int) else fd.fileno()
        kind = "dirs" if stat.S_ISDIR(os.fstat(fdn).st_mode) else "files"
        with lock:
            counts[kind] += 1
        real(fd)

    os.fsync = counting
    try:
        yield counts
    finally:
        os.fsync = real


def peak_memory(fn: Callable[[], object]) -> dict[str, int | None]:
    """Peak Python allocations (tracemalloc) and peak RSS growth while ``fn`` runs.

    The RSS peak (VmHWM) is reset through /proc/self/clear_refs first; where
    that cannot be written the growth is None.
    """
    clear_refs = Path("/proc/self/clear_refs")
    can_reset = clear_refs.exists() and os.access(clear_refs, os.W_OK)
    if can_reset:
        clear_refs.write_text("5\n")  # reset VmHWM (peak RSS) to the current RSS
    rss0 = _status_kib("VmRSS")
    tracemalloc.start()
    try:
        fn()
        _, traced_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    hwm = _status_kib("VmHWM")
    return {
        "tracemalloc_peak_bytes": traced_peak,
        "rss_peak_delta_bytes": (hwm - rss0) * 1024 if can_reset else None,
    }


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def fsync_latency(work: Path, settle: Callable[[], None], n: int = 30) -> dict[str, float]:
    """Median latency of one fsync of a fresh 4 KiB file and of a directory with a new entry."""
    d = work / f"lat-{uuid.uuid4().hex[:12]}"
    d.mkdir()
    settle()
    file_t, dir_t = [], []
    for i in range(n):
        fd = os.open(d / f"f{i}", os.O_WRONLY | os.O_CREAT, 0o666)
        os.write(fd, b"x" * 4096)
        t0 = time.perf_counter()
        os.fsync(fd)
        file_t.append(time.perf_counter() - t0)
        os.close(fd)
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        t0 = time.perf_counter()
        os.fsync(dfd)
        dir_t.append(time.perf_counter() - t0)
        os.close(dfd)
    shutil.rmtree(d)
    return {"file_4k_s": statistics.median(file_t), "dir_s": statistics.median(dir_t)}


# ---------------------------------------------------------------------- timing a case


class Workload(Protocol):
    """What the timing loop needs to know of a payload."""

    @property
    def name(self) -> str: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def nfiles(self) -> int: ...


W = TypeVar("W", bound=Workload)


@dataclass
class Method(Generic[W]):
    """One way to save a payload into a directory (``run(payload, target)``)."""

    name: str
    run: Callable[[W, Path], None]
    note: str = ""
    # The steady state of training: the checkpoint root exists (its creation,
    # durable too, happens once). Every method still creates one new directory
    # per save inside the timing: for a commit, the staging dir.
    existing_root: bool = False


@dataclass
class Case(Generic[W]):
    name: str
    build: Callable[[], W]
    repeats: int


@dataclass
class Result:
    case: str
    method: str
    runs: list[float] = field(default_factory=list)
    fsyncs: dict[str, int] = field(default_factory=dict)


def _one_run(
    method: Method[W], payload: W, work: Path, settle: Settler, trash: list[Path]
) -> float:
    """Time one save into a fresh directory; delete it now (few files) or with the case."""
    target = work / f"run-{uuid.uuid4().hex[:12]}"
    if method.existing_root:
        target.mkdir()
    settle()
    prefault(2 * payload.nbytes)
    with Stopwatch() as elapsed:
        method.run(payload, target)
    if payload.nfiles >= 100:
        trash.append(target)  # deleting 1,000 inodes now would slow the next run's creates
    else:
        shutil.rmtree(target)
    return elapsed.seconds


def measure_memory(method: Method[W], payload: W, work: Path, settle: Settler) -> dict[str, Any]:
    """Peak memory of one save of ``payload`` by ``method`` (the file writes included)."""
    target = work / f"mem-{uuid.uuid4().hex[:12]}"
    if method.existing_root:
        target.mkdir()
    settle()
    peak = peak_memory(lambda: method.run(payload, target))
    shutil.rmtree(target)
    return {
        "case": payload.name,
        "bytes_committed": payload.nbytes,
        **peak,
        "method": method.name,
    }


def run_case(
    case: Case[W],
    meths: Sequence[Method[W]],
    work: Path,
    settle: Settler,
    *,
    memory: Method[W] | None,
) -> tuple[list[Result], dict[str, Any] | None]:
    """Time every method on ``case``, alternating them; then the peak memory of ``memory``."""
    meths = list(meths)
    payload = case.build()
    results = {m.name: Result(case.name, m.name) for m in meths}
    trash: list[Path] = []
    settle.between_cases()
    # One untimed warm-up per method (imports, first-touch of memory, a warm
    # metadata cache), which also counts the method's fsyncs.
    for m in meths:
        with count_fsyncs() as counts:
            _one_run(m, payload, work, settle, trash)
        results[m.name].fsyncs = dict(counts)
    for rep in range(case.repeats):
        shift = rep % len(meths)
        for m in meths[shift:] + meths[:shift]:
            results[m.name].runs.append(_one_run(m, payload, work, settle, trash))
        log(f"  {case.name}: repetition {rep + 1}/{case.repeats} done")
    mem = measure_memory(memory, payload, work, settle) if memory is not None else None
    for path in trash:
        shutil.rmtree(path)
    del payload
    gc.collect()
    return list(results.values()), mem


# ---------------------------------------------------------------------- the machine


def machine() -> dict[str, Any]:
    """CPU, cores, RAM, kernel and the versions of Python, torch and atomic_ckpt."""
    import torch

    import atomic_ckpt

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    ram = None
    with contextlib.suppress(OSError, ValueError):
        ram = _meminfo_kib("MemTotal") * 1024
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_bytes": ram,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "atomic_ckpt": atomic_ckpt.__version__,
        "host_memory": host_memory.describe(),
    }


def _meminfo_kib(key: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise ValueError(key)


def filesystem(path: Path) -> str:
    """The mount (device, type, options) holding ``path``, from /proc/mounts."""
    best, desc = "", "unknown"
    real = os.path.realpath(path)
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            dev, mnt, fstype, opts, *_ = line.split()
            inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
            if inside and len(mnt) >= len(best):
                best, desc = mnt, f"{fstype} ({dev} on {mnt}, {opts})"
    name = desc.split("(", 1)[-1].split(" ", 1)[0].rsplit("/", 1)[-1]
    with contextlib.suppress(OSError):
        # ext4 without a journal behaves differently (cheap metadata, no commit batching).
        task = Path(f"/sys/fs/ext4/{name}/journal_task").read_text().strip()
        desc += ", no journal" if task in ("", "<none>") else ", journaled"
    return desc


def machine_line(info: dict[str, Any]) -> str:
    """``machine()`` (plus its ``filesystem`` entry) in one line."""
    ram = f"{info['ram_bytes'] / GiB:.0f} GiB RAM" if info.get("ram_bytes") else "RAM unknown"
    return (
        f"{info['cpu']}, {info['cores']} cores, {ram}, {info['filesystem']}, "
        f"Linux {info['kernel']}, Python {info['python']}, torch {info['torch']}"
        + (f", {info['host_memory']}" if info.get("host_memory") else "")
    )


def loadavg() -> list[str]:
    """The 1, 5 and 15 minute load averages, as /proc/loadavg prints them."""
    return Path("/proc/loadavg").read_text().split()[:3]
