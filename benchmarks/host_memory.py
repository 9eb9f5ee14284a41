"""Keep a virtual machine's free memory backed by its host while a benchmark runs.

::

    sudo python benchmarks/host_memory.py keep      # before the benchmarks
    sudo python benchmarks/host_memory.py restore   # after them
    python benchmarks/host_memory.py                # what the machine does now
    python benchmarks/host_memory.py probe DIR      # the effect, measured in DIR

Why: a VM with virtio-balloon free page reporting (Linux ``page_reporting``, as
on this machine) hands the memory it frees back to its host, in blocks of
2^``page_reporting_order`` pages, a few seconds after freeing it. A write that
grows the page cache into such memory takes it back one host fault at a time:
here ``probe`` wrote and fsynced 800 MB in 1.8-2.3 s with reporting on (after a
minute idle) against 0.41-0.53 s after ``keep``. Which method of a benchmark
meets such memory depends on what the machine did a moment earlier, not on the
method, so side-by-side ratios swing by 2-3x.

``keep`` raises the order above the largest block the kernel has (so no free
block is reported again) and touches the free memory once (so what was already
reported is backed again); ``restore`` puts the order back. Every benchmark's
machine line says which state it ran in (:func:`describe`).
"""

from __future__ import annotations

import argparse
import mmap
import sys
from pathlib import Path

ORDER = Path("/sys/module/page_reporting/parameters/page_reporting_order")
SAVED = Path("/run/atomic_ckpt_page_reporting_order")
_OFF = 11
"""Above MAX_PAGE_ORDER (10 on x86-64 and arm64 with 4 KiB pages): nothing is reported."""


def describe() -> str:
    """The free page reporting state, for a benchmark's machine line."""
    try:
        order = int(ORDER.read_text())
    except (OSError, ValueError):
        return "no free page reporting"
    if order >= _OFF:
        return "free page reporting off (host_memory.py keep)"
    return f"free page reporting on (blocks of {4 << order} KiB: expect noise, see host_memory.py)"


def _available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise OSError("MemAvailable not in /proc/meminfo")


def keep(reserve_gib: float) -> None:
    """Stop reporting, then touch all available memory but ``reserve_gib`` once."""
    old = ORDER.read_text().strip()
    if int(old) < _OFF:
        SAVED.write_text(old)
    ORDER.write_text(str(_OFF))
    size = max(0, _available_bytes() - int(reserve_gib * (1 << 30)))
    size -= size % mmap.PAGESIZE
    print(f"touching {size / (1 << 30):.1f} GiB once...", file=sys.stderr)
    if size:
        area = mmap.mmap(-1, size)
        for offset in range(0, size, mmap.PAGESIZE):
            area[offset] = 1
        area.close()


def restore() -> None:
    """Put the reporting order back to what ``keep`` found (default 9)."""
    old = SAVED.read_text().strip() if SAVED.exists() else "9"
    ORDER.write_text(old)
    SAVED.unlink(missing_ok=True)


def probe(directory: Path, rounds: int = 6, size: int = 800 << 20) -> None:
    """Write and fsync ``size`` bytes into ``rounds`` new files of ``directory`` (kept
    until the end, so the page cache grows into memory it has not used lately); print each
    time, then delete them. With reporting on, a round whose pages the host had taken back
    takes several times longer."""
    import os
    import time

    chunk = os.urandom(32 << 20)
    paths = [directory / f"host_memory_probe_{os.getpid()}_{i}" for i in range(rounds)]
    try:
        for i, path in enumerate(paths):
            start = time.perf_counter()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                for _ in range(size // len(chunk)):
                    os.write(fd, chunk)
                os.fsync(fd)
            finally:
                os.close(fd)
            took = time.perf_counter() - start
            print(f"file {i + 1}: {size >> 20} MB written and fsynced in {took:.2f} s", flush=True)
    finally:
        for path in paths:
            path.unlink(missing_ok=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("action", nargs="?", choices=["keep", "restore", "probe"])
    parser.add_argument("directory", nargs="?", type=Path, default=Path("."), help="for probe")
    parser.add_argument("--reserve-gib", type=float, default=2.0, help="memory left untouched")
    args = parser.parse_args()
    if args.action in ("keep", "restore") and not ORDER.exists():
        print(f"host_memory.py: {ORDER} does not exist: nothing to do here", file=sys.stderr)
        return 0
    try:
        if args.action == "keep":
            keep(args.reserve_gib)
        elif args.action == "restore":
            restore()
        elif args.action == "probe":
            print(describe())
            probe(args.directory)
            return 0
    except PermissionError:
        print(f"host_memory.py: writing {ORDER} needs root", file=sys.stderr)
        return 2
    print(describe())
    return 0


if __name__ == "__main__":
    sys.exit(main())
