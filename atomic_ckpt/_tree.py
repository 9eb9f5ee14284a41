"""Walk a checkpoint tree once: list its entries, fsync and (optionally) hash its files.

Files are fsynced in parallel: ``os.fsync`` releases the GIL, so threads let the
disk work on many files' writeback at once, and a checksum of one file is
computed while another (or the same one) is being flushed. Symlinks are
recorded, never followed, opened, fsynced or hashed.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from . import _fs
from ._manifest import FileEntry

log = logging.getLogger(__name__)

_CHUNK = 1 << 20
_MAX_WORKERS = 16


def _crc32(fd: int) -> str:
    crc = 0
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    while n := os.readv(fd, [buf]):
        crc = zlib.crc32(view[:n], crc)
    return f"{crc:08x}"


def _hashlib(name: str) -> Callable[[int], str]:
    def digest(fd: int) -> str:
        h = hashlib.new(name)
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        while n := os.readv(fd, [buf]):
            h.update(view[:n])
        return h.hexdigest()

    return digest


def _xxh3(fd: int) -> str:
    import xxhash

    h = xxhash.xxh3_128()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    while n := os.readv(fd, [buf]):
        h.update(view[:n])
    return str(h.hexdigest())


CHECKSUMS: dict[str, Callable[[int], str]] = {
    "crc32": _crc32,
    "sha256": _hashlib("sha256"),
    "xxh3_128": _xxh3,
}
"""Supported checksum algorithms: name -> function of an open fd (read from offset 0)."""


def checksum_file(path: Path, algorithm: str) -> str:
    """The checksum of a regular file, never following a symlink."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        return CHECKSUMS[algorithm](fd)
    finally:
        os.close(fd)


def _walk(
    top: Path, rel: str, skip: Callable[[str], bool]
) -> Iterator[tuple[str, os.DirEntry[str]]]:
    with os.scandir(top) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        if not rel and skip(entry.name):
            continue
        path = f"{rel}{entry.name}"
        yield path, entry
        if entry.is_dir(follow_symlinks=False):
            yield from _walk(Path(entry.path), f"{path}/", _keep)


def _keep(_name: str) -> bool:
    return False


def sync_tree(
    top: Path,
    *,
    fsync_files: bool,
    fsync_dirs: bool,
    checksum: str | None,
    skip: Callable[[str], bool] = _keep,
) -> list[FileEntry]:
    """List every entry under ``top``; fsync its files and subdirectories (not ``top``).

    ``skip`` says which top-level names to leave out (the marker and its
    temporary names). Returns the entries sorted by path. Any fsync error
    propagates: a failed fsync is never retried (the kernel may have dropped
    the dirty pages, so a retry that succeeds proves nothing).
    """
    files: list[tuple[str, Path, int]] = []
    dirs: list[tuple[str, Path]] = []
    links: list[FileEntry] = []
    for rel, entry in _walk(top, "", skip):
        st = entry.stat(follow_symlinks=False)
        if stat.S_ISREG(st.st_mode):
            files.append((rel, Path(entry.path), st.st_size))
        elif stat.S_ISDIR(st.st_mode):
            dirs.append((rel, Path(entry.path)))
        elif stat.S_ISLNK(st.st_mode):
            links.append(FileEntry(rel, "symlink", target=os.readlink(entry.path)))
        else:
            log.warning("%s is not a file, directory or symlink; it is not recorded", entry.path)

    sizes = {rel: size for rel, _, size in files}
    files_to_sync = files if fsync_files else []
    dirs_to_sync = dirs if fsync_dirs else []
    jobs = len(files_to_sync) + len(dirs_to_sync) + (len(files) if checksum else 0)
    workers = min(_MAX_WORKERS, jobs)
    if workers <= 1:
        # Nothing to parallelize: do it inline (no thread start-up cost).
        sums = {rel: checksum_file(path, checksum) for rel, path, _ in files} if checksum else {}
        for _, path, _ in files_to_sync:
            _fs.fsync_file(path)
        for _, path in dirs_to_sync:
            _fs.fsync_dir(path)
    else:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="atomic_ckpt") as pool:
            # Largest files first, so the longest flushes start earliest; each
            # file's checksum runs beside its flush.
            pending: list[Future[None]] = []
            hashing: dict[str, Future[str]] = {}
            for rel, path, _ in sorted(files, key=lambda f: -f[2]):
                if fsync_files:
                    pending.append(pool.submit(_fs.fsync_file, path))
                if checksum:
                    hashing[rel] = pool.submit(checksum_file, path, checksum)
            pending.extend(pool.submit(_fs.fsync_dir, path) for _, path in dirs_to_sync)
            for fut in pending:
                fut.result()
            sums = {rel: fut.result() for rel, fut in hashing.items()}
    return _entries(files, dirs, links, sizes, sums)


def _entries(
    files: list[tuple[str, Path, int]],
    dirs: list[tuple[str, Path]],
    links: list[FileEntry],
    sizes: dict[str, int],
    sums: dict[str, str],
) -> list[FileEntry]:
    out = [FileEntry(rel, "file", size=sizes[rel], checksum=sums.get(rel)) for rel, _, _ in files]
    out += [FileEntry(rel, "dir") for rel, _ in dirs]
    out += links
    return sorted(out, key=lambda e: e.path)
