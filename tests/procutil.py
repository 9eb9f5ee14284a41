"""Watching another process from a test (Linux /proc; no pytest here)."""

from __future__ import annotations

import time
from pathlib import Path


def wait_until_blocked(pid: int, limit: float = 30.0) -> None:
    """Return once the main thread of ``pid`` sleeps on a lock (a futex: a ``join``, an
    ``Event.wait``), so a signal sent now lands inside that wait, not before it. Seen
    five times 20 ms apart: a wait for the GIL is a futex wait too, but a short one."""
    wchan = Path(f"/proc/{pid}/task/{pid}/wchan")
    until = time.monotonic() + limit
    seen = 0
    while time.monotonic() < until:
        seen = seen + 1 if "futex" in wchan.read_text() else 0
        if seen == 5:
            return
        time.sleep(0.02)
    raise AssertionError(f"process {pid}'s main thread is not waiting on a lock after {limit} s")
