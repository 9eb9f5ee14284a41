"""Protocol mutants: the full durability protocol with one step switched off, which the
power-loss simulation must reject (they live here, never in the library itself)."""

from __future__ import annotations

from pathlib import Path

from atomic_ckpt import MARKER, SyncPolicy
from atomic_ckpt._core.l2_syscalls import fs as _fs

__all__ = ["STEPS", "mutant"]

STEPS = ("file", "subdir", "marker", "marker_tmp", "staging", "root")
"""The durability steps of :class:`~atomic_ckpt.SyncPolicy` a mutant can switch off:
each fsync method, and ``marker_tmp`` (the marker written in place where a
temporary name was asked for)."""


class _Mutant(SyncPolicy):
    def __init__(self, off: str) -> None:
        self.off = off

    def start_file(self, path: Path, offset: int = 0, length: int = 0) -> None:
        if self.off != "file":  # without the file step, no early writeback of its data either
            super().start_file(path, offset, length)

    def file(self, path: Path) -> None:
        if self.off != "file":
            super().file(path)

    def subdir(self, path: Path) -> None:
        if self.off != "subdir":
            super().subdir(path)

    def marker(self, directory: Path, data: bytes, *, tmp: Path | None) -> None:
        if self.off == "marker":
            _fs.write_file_durable(directory / MARKER, data, tmp=tmp, sync=False)
        else:
            super().marker(directory, data, tmp=None if self.off == "marker_tmp" else tmp)

    def staging(self, path: Path) -> None:
        if self.off != "staging":
            super().staging(path)

    def root(self, path: Path) -> None:
        if self.off != "root":
            super().root(path)

    def __repr__(self) -> str:
        return f"mutant(without={self.off!r})"


def mutant(without: str) -> SyncPolicy:
    """The full :class:`~atomic_ckpt.SyncPolicy` with one step (one of :data:`STEPS`)
    switched off: a protocol the crash simulation must reject."""
    if without not in STEPS:
        raise ValueError(f"unknown step {without!r}; choose one of {STEPS}")
    return _Mutant(without)
