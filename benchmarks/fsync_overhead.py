"""What durability costs: atomic_ckpt against the unsafe save, the durable floor and its peers.

Run ``python benchmarks/fsync_overhead.py`` (full, ~15 minutes) or with
``--quick`` (about a minute). Every method saves the same in-memory tensors;
each timed run covers the whole save (writes included) into a fresh directory.
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
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
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
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a checkout without installing

import torch  # noqa: E402
from safetensors.torch import save_file, save_model  # noqa: E402

import atomic_ckpt  # noqa: E402
from atomic_ckpt import CheckpointDir, _tree  # noqa: E402

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

# ---------------------------------------------------------------------- payloads


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_bytes(path: Path, data: memoryview, *, fsync: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        view = data
        while view:
            view = view[os.write(fd, view) :]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


class Payload:
    """The tensors of one case, and the files a plain (non-peer) save writes."""

    name: str
    nbytes: int
    nfiles: int

    def write(self, directory: Path, *, fsync: bool) -> None:
        """Write this case's files into ``directory`` (fsync each one if asked)."""
        raise NotImplementedError

    def tensors(self) -> dict[str, torch.Tensor]:
        """A flat name -> tensor dict for torch.save / safetensors."""
        raise NotImplementedError

    def commit(self, ckpts: CheckpointDir) -> None:
        """A durable commit of this case's files as step 1 of ``ckpts``."""
        with ckpts.commit(1) as staging:
            self.write(staging, fsync=False)

    def dcp_state(self) -> dict[str, Any]:
        """The state dict handed to torch.distributed.checkpoint.save."""
        return self.tensors()


class FilesPayload(Payload):
    """``count`` raw files of ``size`` random bytes each (one tensor per file)."""

    def __init__(self, name: str, count: int, size: int) -> None:
        self.name, self.nfiles, self.nbytes = name, count, count * size
        gen = torch.Generator().manual_seed(0)
        self._tensors = {
            f"shard_{i:05d}.bin": torch.randint(0, 256, (size,), dtype=torch.uint8, generator=gen)
            for i in range(count)
        }
        self._views = {k: memoryview(t.numpy()) for k, t in self._tensors.items()}

    def write(self, directory: Path, *, fsync: bool) -> None:
        for name, view in self._views.items():
            _write_bytes(directory / name, view, fsync=fsync)

    def tensors(self) -> dict[str, torch.Tensor]:
        return self._tensors


class _Block(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, 4 * d)
        self.down = torch.nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a)
        return x + self.down(torch.nn.functional.gelu(self.up(self.ln2(x))))


class TinyLM(torch.nn.Module):
    """A small GPT-like model (untied embedding and head)."""

    def __init__(self, vocab: int, d: int, layers: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.blocks = torch.nn.ModuleList(_Block(d) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        out: torch.Tensor = self.head(self.ln(x))
        return out


def _write_state_inline(
    directory: Path, *, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    """What ``atomic_ckpt.torch.write_state`` writes (for a checkout without it)."""
    save_model(model, str(directory / "model.safetensors"))
    torch.save(optimizer.state_dict(), directory / "optimizer.pt")
    (directory / "training_state.json").write_text(json.dumps({"step": step}) + "\n")


class StatePayload(Payload):
    """A real training state: a transformer-like model and its Adam state after one step."""

    def __init__(self, name: str, vocab: int, d: int, layers: int) -> None:
        torch.manual_seed(0)
        self.name = name
        self.model = TinyLM(vocab, d, layers)
        self.optim = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        idx = torch.randint(0, vocab, (2, 16))
        logits = self.model(idx)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx.flatten()).backward()
        self.optim.step()
        self.optim.zero_grad(set_to_none=True)
        params = sum(p.numel() * p.element_size() for p in self.model.parameters())
        self.model_bytes = params
        self.nbytes = 3 * params  # weights + exp_avg + exp_avg_sq
        self.nfiles = 3
        try:
            from atomic_ckpt.torch import save_state, write_state
        except ImportError:
            self._write, self._save = _write_state_inline, None
        else:
            self._write, self._save = write_state, save_state

    def write(self, directory: Path, *, fsync: bool) -> None:
        self._write(directory, step=1, model=self.model, optimizer=self.optim)
        if fsync:
            for entry in sorted(os.scandir(directory), key=lambda e: e.name):
                if entry.is_file(follow_symlinks=False):
                    _fsync_path(Path(entry.path))

    def tensors(self) -> dict[str, torch.Tensor]:
        flat = {f"model.{k}": v for k, v in self.model.state_dict().items()}
        for pid, state in self.optim.state_dict()["state"].items():
            for k, v in state.items():
                flat[f"optim.{pid}.{k}"] = v
        return flat

    def commit(self, ckpts: CheckpointDir) -> None:
        if self._save is None:
            super().commit(ckpts)
        else:  # the library's own helper, as a user would call it
            self._save(ckpts, 1, model=self.model, optimizer=self.optim)

    def dcp_state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optim)
        return {"model": model_sd, "optim": optim_sd}


# ---------------------------------------------------------------------- methods


@dataclass
class Method:
    name: str
    run: Callable[[Payload, Path], None]
    note: str = ""
    is_library: bool = False


@contextlib.contextmanager
def _workers(n: int | None) -> Iterator[None]:
    """Cap atomic_ckpt's fsync/hash thread pool (None: leave the library's choice)."""
    if n is None:
        yield
        return
    saved = _tree._MAX_WORKERS
    _tree._MAX_WORKERS = n
    try:
        yield
    finally:
        _tree._MAX_WORKERS = saved


def _atomic(**kwargs: Any) -> Callable[[Payload, Path], None]:
    workers = kwargs.pop("workers", None)

    def run(payload: Payload, target: Path) -> None:
        with _workers(workers):
            payload.commit(CheckpointDir(target, **kwargs))

    run.existing_root = True  # type: ignore[attr-defined]
    return run


def _unsafe(payload: Payload, target: Path) -> None:
    target.mkdir()
    payload.write(target, fsync=False)


def _floor(payload: Payload, target: Path) -> None:
    target.mkdir()
    payload.write(target, fsync=True)


def _torch_save(payload: Payload, target: Path) -> None:
    target.mkdir()
    path = target / "state.pt"
    obj: Any
    if isinstance(payload, StatePayload):
        obj = {"model": payload.model.state_dict(), "optim": payload.optim.state_dict()}
    else:
        obj = payload.tensors()
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def _safetensors_save(payload: Payload, target: Path) -> None:
    target.mkdir()
    path = target / "state.safetensors"
    save_file(payload.tensors(), str(path))
    _fsync_path(path)


def _dcp_save(payload: Payload, target: Path) -> None:
    import torch.distributed.checkpoint as dcp

    writer = dcp.FileSystemWriter(str(target), sync_files=True)
    dcp.save(payload.dcp_state(), storage_writer=writer)


def default_checksum() -> str | None:
    import inspect

    default = inspect.signature(CheckpointDir.__init__).parameters["checksum"].default
    return default if default is None or isinstance(default, str) else None


def methods() -> list[Method]:
    default = default_checksum()
    out = [
        Method("unsafe", _unsafe, "same files, no fsync"),
        Method("floor", _floor, "same writes + fsync of each file"),
        Method("atomic_ckpt", _atomic(), f"durable commit, defaults (checksum={default})", True),
    ]
    for algo in [None, "crc32", "xxh3_128", "sha256"]:
        if algo != default:
            out.append(
                Method(f"atomic_ckpt checksum={algo}", _atomic(checksum=algo), "durable", True)
            )
    out += [
        Method("atomic_ckpt serial", _atomic(workers=1), "defaults, one fsync at a time", True),
        Method("atomic_ckpt durable=False", _atomic(durable=False), "atomic, no fsync", True),
        Method("torch.save+fsync", _torch_save, "one file"),
        Method("safetensors+fsync", _safetensors_save, "one file"),
        Method("dcp sync_files", _dcp_save, "FileSystemWriter(sync_files=True)"),
    ]
    return out


def baseline_method(tree_py: Path, checksum: str | None) -> Method:
    """A durable commit whose tree walk is an older ``_tree.py`` (to show a change's gain).

    e.g. ``git show 74eadb4:atomic_ckpt/_tree.py > /tmp/tree0.py`` then
    ``--baseline-tree /tmp/tree0.py --baseline-checksum crc32``.
    """
    import importlib.util

    from atomic_ckpt import _checkpoint

    spec = importlib.util.spec_from_file_location("atomic_ckpt._tree_baseline", tree_py)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {tree_py}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    inner = _atomic(checksum=checksum)

    def run(payload: Payload, target: Path) -> None:
        saved = _checkpoint.sync_tree
        _checkpoint.sync_tree = module.sync_tree
        try:
            inner(payload, target)
        finally:
            _checkpoint.sync_tree = saved

    run.existing_root = True  # type: ignore[attr-defined]
    note = f"before: _tree.py from {tree_py.name}, checksum={checksum}"
    return Method("atomic_ckpt before", run, note, True)


# ---------------------------------------------------------------------- harness


@dataclass
class Case:
    name: str
    build: Callable[[], Payload]
    repeats: int


@dataclass
class Result:
    case: str
    method: str
    runs: list[float] = field(default_factory=list)
    fsyncs: dict[str, int] = field(default_factory=dict)


def _tiny_cases(repeats: int) -> list[Case]:
    return [
        Case("1 file of 4 KiB", lambda: FilesPayload("1 file of 4 KiB", 1, 4 * KiB), repeats),
        Case("20 files of 4 KiB", lambda: FilesPayload("20 files of 4 KiB", 20, 4 * KiB), repeats),
        Case(
            "training state (tiny)",
            lambda: StatePayload("training state (tiny)", 256, 32, 1),
            repeats,
        ),
    ]


def _cases(quick: bool, repeats: int | None) -> list[Case]:
    r = repeats or 3
    full = repeats is None and not quick  # cheap cases get more runs: their noise is larger
    big = 256 * MiB if quick else GiB
    big_name = "1 file of 256 MiB" if quick else "1 file of 1 GiB"
    state = (
        ("training state ~40 MB (quick)", 8000, 256, 4)
        if quick
        else ("training state ~250 MB + Adam", 16000, 768, 6)
    )
    cases = [
        Case("1 file of 1 MiB", lambda: FilesPayload("1 file of 1 MiB", 1, MiB), 15 if full else r),
        Case(
            "1 file of 64 MiB",
            lambda: FilesPayload("1 file of 64 MiB", 1, 64 * MiB),
            11 if full else r,
        ),
        Case(big_name, lambda: FilesPayload(big_name, 1, big), 9 if full else r),
        Case(
            "1,000 files of 64 KiB",
            lambda: FilesPayload("1,000 files of 64 KiB", 1000, 64 * KiB),
            9 if full else r,
        ),
        Case(state[0], lambda: StatePayload(*state), 11 if full else r),
    ]
    return cases


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
        gc.collect()
        os.sync()

    def between_cases(self) -> None:
        self()
        if self.drop:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("1\n")  # clean page cache only: dentries and inodes stay


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


def _prefault(nbytes: int) -> None:
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


def _one_run(
    method: Method, payload: Payload, work: Path, settle: Settler, trash: list[Path]
) -> float:
    """Time one save into a fresh directory; delete it now (few files) or with the case."""
    target = work / f"run-{uuid.uuid4().hex[:12]}"
    if getattr(method.run, "existing_root", False):
        # The steady state of training: the checkpoint root exists (its creation,
        # durable too, happens once). Every method still creates one new directory
        # per save inside the timing: here the staging dir.
        target.mkdir()
    settle()
    _prefault(2 * payload.nbytes)
    t0 = time.perf_counter()
    method.run(payload, target)
    elapsed = time.perf_counter() - t0
    if payload.nfiles >= 100:
        trash.append(target)  # deleting 1,000 inodes now would slow the next run's creates
    else:
        shutil.rmtree(target)
    return elapsed


def measure_memory(payload: Payload, work: Path, settle: Settler) -> dict[str, Any]:
    """Peak memory of one default durable commit of ``payload`` (the file write included)."""
    target = work / f"mem-{uuid.uuid4().hex[:12]}"
    target.mkdir()
    settle()
    clear_refs = Path("/proc/self/clear_refs")
    can_reset = clear_refs.exists() and os.access(clear_refs, os.W_OK)
    if can_reset:
        clear_refs.write_text("5\n")  # reset VmHWM (peak RSS) to the current RSS
    rss0 = _status_kib("VmRSS")
    tracemalloc.start()
    payload.commit(CheckpointDir(target))
    _, traced_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    hwm = _status_kib("VmHWM")
    shutil.rmtree(target)
    return {
        "case": payload.name,
        "bytes_committed": payload.nbytes,
        "tracemalloc_peak_bytes": traced_peak,
        "rss_peak_delta_bytes": (hwm - rss0) * 1024 if can_reset else None,
        "method": "atomic_ckpt (defaults), write + commit",
    }


def fsync_latency(work: Path, settle: Settler, n: int = 30) -> dict[str, float]:
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


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def run_case(
    case: Case, meths: list[Method], work: Path, settle: Settler, *, memory: bool, log: Any
) -> tuple[list[Result], dict[str, Any] | None]:
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
    mem = measure_memory(payload, work, settle) if memory else None
    for path in trash:
        shutil.rmtree(path)
    del payload
    gc.collect()
    return list(results.values()), mem


# ---------------------------------------------------------------------- reporting


def rows_of(results: list[Result], meths: list[Method]) -> list[dict[str, Any]]:
    notes = {m.name: m.note for m in meths}
    rows: list[dict[str, Any]] = []
    by_case: dict[str, dict[str, Result]] = {}
    for r in results:
        by_case.setdefault(r.case, {})[r.method] = r
    for case, res in by_case.items():
        floor = statistics.median(res["floor"].runs)
        floor_min = min(res["floor"].runs)
        unsafe = statistics.median(res["unsafe"].runs)
        for name, r in res.items():
            med = statistics.median(r.runs)
            lo, hi = min(r.runs), max(r.runs)
            rows.append(
                {
                    "case": case,
                    "method": name,
                    "note": notes[name],
                    "median_s": med,
                    "min_s": lo,
                    "max_s": hi,
                    "spread": (hi - lo) / med if med else 0.0,
                    "runs": r.runs,
                    "ratio_to_floor": med / floor if floor else None,
                    "ratio_to_floor_min": lo / floor_min if floor_min else None,
                    # Runs of one repetition ran back to back (the order rotating):
                    # the median of the per-repetition ratios cancels slow drift
                    # in the machine's background load.
                    "ratio_to_floor_paired": statistics.median(
                        a / b for a, b in zip(r.runs, res["floor"].runs, strict=True)
                    ),
                    "ratio_to_unsafe": med / unsafe if unsafe else None,
                    "fsyncs": r.fsyncs.get("files", 0) + r.fsyncs.get("dirs", 0),
                    "fsyncs_files": r.fsyncs.get("files", 0),
                    "fsyncs_dirs": r.fsyncs.get("dirs", 0),
                }
            )
    return rows


def machine() -> dict[str, Any]:
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
    ram = f"{info['ram_bytes'] / GiB:.0f} GiB RAM" if info.get("ram_bytes") else "RAM unknown"
    return (
        f"{info['cpu']}, {info['cores']} cores, {ram}, {info['filesystem']}, "
        f"Linux {info['kernel']}, Python {info['python']}, torch {info['torch']}"
    )


def _fmt_s(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "# What durability costs (`benchmarks/fsync_overhead.py`)",
        "",
        f"Machine: {meta['machine_line']}.",
        "",
        f"Load average at the end of the run: {', '.join(meta.get('loadavg_end', []))} "
        "(other work shared the machine: compare methods within a case, not across runs)."
        + (
            f" {meta['busy_processes']} CPU-bound processes ran throughout (`--busy`), "
            "as a trainer's data-loader workers would."
            if meta.get("busy_processes")
            else ""
        ),
        "",
        f"Run: {meta['finished']}, `{meta['command']}`; {meta['settle']}. Each cell is the "
        "median of the repetitions (spread = (max - min) / median); ratio = median / median of "
        "`floor`; fsyncs counted in one run (files + directories).",
        "",
    ]
    lines += summary(rows, meta)
    cases = list(dict.fromkeys(r["case"] for r in rows))
    for case in cases:
        case_rows = [r for r in rows if r["case"] == case]
        lines += [
            f"## {case}",
            "",
            "| method | median | min | spread | runs | / floor | (paired) | (best) | / unsafe "
            "| fsyncs (files+dirs) | note |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for r in case_rows:
            lines.append(
                f"| {r['method']} | {_fmt_s(r['median_s'])} | {_fmt_s(r['min_s'])} "
                f"| {r['spread'] * 100:.0f}% | {len(r['runs'])} | {r['ratio_to_floor']:.3f} "
                f"| {r['ratio_to_floor_paired']:.3f} | {r['ratio_to_floor_min']:.3f} "
                f"| {r['ratio_to_unsafe']:.3f} "
                f"| {r['fsyncs']} ({r['fsyncs_files']}+{r['fsyncs_dirs']}) | {r['note']} |"
            )
        lines.append("")
    for mem in meta.get("memory", []):
        rss = mem["rss_peak_delta_bytes"]
        rss_s = f"{rss / MiB:.1f} MiB" if rss is not None else "n/a"
        lines += [
            f"Peak memory of one durable commit of {mem['case']} ({mem['method']}): "
            f"tracemalloc peak {mem['tracemalloc_peak_bytes'] / MiB:.2f} MiB, "
            f"peak RSS growth {rss_s}, for {mem['bytes_committed'] / MiB:.0f} MiB committed.",
            "",
        ]
    return "\n".join(lines)


def _row(rows: list[dict[str, Any]], case: str, method: str) -> dict[str, Any] | None:
    return next((r for r in rows if r["case"] == case and r["method"] == method), None)


def summary(rows: list[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    """The targets of the issue, one line per case, computed from the rows."""
    lat = meta.get("fsync_latency") or {}
    default = meta.get("default_checksum")
    lines = [
        "## Summary",
        "",
        f"fsync latency here (median): 4 KiB file {lat.get('file_4k_s', 0) * 1e3:.2f} ms, "
        f"directory {lat.get('dir_s', 0) * 1e3:.2f} ms. Default checksum: `{default}`. "
        "Ratios of medians; (paired) = median over repetitions of atomic_ckpt / floor "
        "within the same repetition; (best runs) = fastest atomic_ckpt run / fastest floor "
        "run. The last two are steadier when other work shares the machine. checksum cost = "
        "(default - checksum=None) / default; fixed cost = atomic_ckpt - floor (medians).",
        "",
        "| case | atomic_ckpt / floor | (paired) | (best runs) | / unsafe | / dcp sync_files "
        "| checksum cost | fixed cost | extra fsyncs | serial / parallel |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for case in dict.fromkeys(r["case"] for r in rows):
        a, floor = _row(rows, case, "atomic_ckpt"), _row(rows, case, "floor")
        if a is None or floor is None:
            continue
        none = _row(rows, case, "atomic_ckpt checksum=None")
        dcp = _row(rows, case, "dcp sync_files")
        serial = _row(rows, case, "atomic_ckpt serial")
        ck = f"{(a['median_s'] - none['median_s']) / a['median_s'] * 100:+.1f}%" if none else "-"
        vs_dcp = f"{a['median_s'] / dcp['median_s']:.2f}" if dcp else "-"
        ser = f"{serial['median_s'] / a['median_s']:.2f}" if serial else "-"
        lines.append(
            f"| {case} | {a['ratio_to_floor']:.3f} | {a['ratio_to_floor_paired']:.3f} "
            f"| {a['ratio_to_floor_min']:.3f} "
            f"| {a['ratio_to_unsafe']:.2f} | {vs_dcp} | {ck} "
            f"| {(a['median_s'] - floor['median_s']) * 1e3:+.1f} ms "
            f"| {a['fsyncs'] - floor['fsyncs']} | {ser} |"
        )
    lines.append("")
    return lines


def chart(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(dict.fromkeys(r["case"] for r in rows))
    n = len(cases)
    nmeth = max(sum(1 for r in rows if r["case"] == c) for c in cases)
    fig, axes = plt.subplots(n, 1, figsize=(9, 0.32 * nmeth * n + 1.2 * n), squeeze=False)
    for ax, case in zip(axes[:, 0], cases, strict=True):
        case_rows = [r for r in rows if r["case"] == case]
        floor = next(r["median_s"] for r in case_rows if r["method"] == "floor")
        names = [r["method"] for r in case_rows]
        ratios = [r["ratio_to_floor"] for r in case_rows]
        lo = [r["ratio_to_floor"] - r["min_s"] / floor for r in case_rows]
        hi = [r["max_s"] / floor - r["ratio_to_floor"] for r in case_rows]
        colors = [
            "tab:gray"
            if name == "unsafe"
            else "black"
            if name == "floor"
            else "tab:blue"
            if name.startswith("atomic_ckpt")
            else "tab:orange"
            for name in names
        ]
        y = range(len(names))
        ax.barh(list(y), ratios, xerr=[lo, hi], color=colors, capsize=2)
        ax.axvline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_yticks(list(y), names, fontsize=8)
        ax.invert_yaxis()
        ax.set_title(f"{case} (floor = {_fmt_s(floor)})", fontsize=10)
        ax.set_xlabel("median time / floor (whiskers: min..max)", fontsize=8)
        for yi, ratio in zip(y, ratios, strict=True):
            ax.text(ratio, yi, f" {ratio:.2f}", va="center", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="small cases, 3 runs (~1 minute)")
    size.add_argument("--tiny", action="store_true", help="KiB-sized cases (for the test suite)")
    parser.add_argument("--repeats", type=int, help="timed runs per method and case")
    parser.add_argument("--out", type=Path, default=HERE / "results", help="output directory")
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
        "--baseline-tree", type=Path, help="an older atomic_ckpt/_tree.py to compare against"
    )
    parser.add_argument(
        "--baseline-checksum", default="crc32", help="checksum for --baseline-tree (or 'none')"
    )
    args = parser.parse_args(argv)

    out: Path = args.out
    if args.render:
        rows = json.loads((out / "fsync_overhead.json").read_text())
        meta = json.loads((out / "fsync_overhead_meta.json").read_text())
        (out / "fsync_overhead.md").write_text(markdown(rows, meta))
        if not args.no_chart:
            chart(rows, out / "fsync_overhead.png")
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
    if args.baseline_tree:
        algo = None if args.baseline_checksum.lower() == "none" else args.baseline_checksum
        meths.insert(3, baseline_method(args.baseline_tree, algo))
    if args.methods:
        keep = {"unsafe", "floor", *(w.strip() for w in args.methods.split(","))}
        meths = [m for m in meths if m.name in keep]
    settle = Settler(not args.no_drop_caches)

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    warnings.filterwarnings("ignore", module="torch.distributed")
    info = machine()
    info["filesystem"] = filesystem(work)
    results: list[Result] = []
    memory: list[dict[str, Any]] = []
    started = time.time()
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)
    ]
    try:
        latency = fsync_latency(work, settle)
        singles = [c for c in cases if c.name.startswith("1 file of")]
        for case in cases:
            log(f"case {case.name}: {len(meths)} methods x {case.repeats} runs")
            big = bool(singles) and case is singles[-1]
            res, mem = run_case(case, meths, work, settle, memory=big, log=log)
            results += res
            if mem is not None:
                memory.append(mem)
    finally:
        for proc in burners:
            proc.kill()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)
        with contextlib.suppress(OSError):
            work_parent.rmdir()  # only if empty

    rows = rows_of(results, meths)
    meta = {
        "machine": info,
        "machine_line": machine_line(info),
        "command": " ".join(["python benchmarks/fsync_overhead.py", *(argv or sys.argv[1:])]),
        "finished": datetime.datetime.now().isoformat(timespec="seconds"),
        "duration_s": time.time() - started,
        "settle": "sync before each run"
        + (", clean page cache dropped before each case" if settle.drop else "")
        + "; methods alternate, order rotating per repetition",
        "default_checksum": default_checksum(),
        "busy_processes": args.busy,
        "memory": memory,
        "fsync_latency": latency,
        "loadavg_end": Path("/proc/loadavg").read_text().split()[:3],
    }
    (out / "fsync_overhead.json").write_text(json.dumps(rows, indent=1) + "\n")
    (out / "fsync_overhead_meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    (out / "fsync_overhead.md").write_text(markdown(rows, meta))
    if not args.no_chart:
        chart(rows, out / "fsync_overhead.png")
    log(f"wrote {out}/fsync_overhead.{{md,json,png}} in {time.time() - started:.0f} s")
    print(markdown(rows, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
