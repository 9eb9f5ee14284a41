"""The trees benchmarks/remote_upload.py uploads: random files (no torch needed), and the
~250 MB training state of benchmarks/fsync_overhead.py (imported only when used)."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Protocol

KiB = 1 << 10


class Tree(Protocol):
    """A named set of files written to a local directory."""

    name: str

    def write(self, directory: Path, *, fsync: bool) -> None: ...


class RandomFiles:
    """``count`` files of ``size`` random bytes each."""

    def __init__(self, name: str, count: int, size: int) -> None:
        self.name, self.count, self.size = name, count, size

    def write(self, directory: Path, *, fsync: bool) -> None:
        rng = random.Random(0)
        for i in range(self.count):
            path = directory / f"shard_{i:05d}.bin"
            with open(path, "wb") as f:
                f.write(rng.randbytes(self.size))
                if fsync:
                    os.fsync(f.fileno())


def training_state(name: str, vocab: int, d: int, layers: int) -> Tree:
    """A real training state (a transformer-like model and its Adam state after one step),
    as benchmarks/fsync_overhead.py writes it: needs torch and safetensors."""
    from _payloads import StatePayload

    return StatePayload(name, vocab, d, layers)
