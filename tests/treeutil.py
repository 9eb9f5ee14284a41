"""Helpers the test modules share for writing and reading whole directory trees."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from atomic_ckpt import MARKER


def write(directory: Path, files: Mapping[str, bytes]) -> None:
    """Write ``files`` (relative path -> bytes) under ``directory``."""
    for rel, data in files.items():
        target = directory / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def contents(directory: Path) -> dict[str, bytes]:
    """Every regular file under ``directory`` except the marker, by relative path."""
    out: dict[str, bytes] = {}
    for dirpath, _dirs, names in os.walk(directory):
        for name in names:
            path = Path(dirpath, name)
            if path.is_file() and not path.is_symlink() and name != MARKER:
                out[path.relative_to(directory).as_posix()] = path.read_bytes()
    return out


def snapshot(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every entry under ``root`` with its mode, size and mtime, without following links."""
    out: dict[str, tuple[int, int, int]] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath, name)
            st = os.lstat(p)
            out[p.relative_to(root).as_posix()] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def unmarked(root: Path, name: str) -> Path:
    """A directory with files but no marker (a legacy or interrupted save)."""
    path = root / name
    path.mkdir(parents=True)
    (path / "model.bin").write_bytes(b"maybe truncated")
    return path


def with_marker(root: Path, name: str, marker: bytes = b"") -> Path:
    """:func:`unmarked` with a marker holding ``marker`` (empty: a legacy marker)."""
    path = unmarked(root, name)
    (path / MARKER).write_bytes(marker)
    return path


def storage_bytes() -> int:
    """Bytes this process has caused to be fetched from storage (/proc/self/io read_bytes:
    reads and page faults alike, page-cache hits not)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    raise AssertionError("no read_bytes in /proc/self/io")


def evict(path: Path) -> None:
    """Drop a file's pages, or those of every regular file under a directory, from the page
    cache (each is fsynced first: only clean pages can be dropped)."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    for file in files:
        if file.is_symlink():
            continue
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
