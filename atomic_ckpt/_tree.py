"""Step 3 of the protocol: walk a checkpoint tree once, fsync and hash its files in parallel.

Files are fsynced on several threads: ``os.fsync`` releases the GIL, so threads
let the disk work on many files' writeback at once, and a checksum of one file
is computed while another (or the same one) is being flushed. Symlinks are
recorded, never followed, opened, fsynced or hashed. The walk is iterative, so
a legally deep tree is walked like any other.
"""

from __future__ import annotations

import functools
import logging
import os
import stat
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from ._manifest import FileEntry, checksum_file

if TYPE_CHECKING:  # at run time this module imports nothing that writes: _read uses it
    from ._sync import SyncPolicy

log = logging.getLogger(__name__)

DEFAULT_WORKERS = 32
"""Threads for fsync and hashing. fsync blocks in the kernel without the GIL, so
many in flight let the disk merge work (1,000 small files here: 1 thread 221 ms,
16 threads 120 ms, 32 threads 110 ms; see benchmarks/fsync_overhead.py)."""
_SPLIT = 8 << 20
"""Files at least this big are hashed in a job of their own, beside their fsync."""

_T = TypeVar("_T")


def walk(
    top: Path, skip: Callable[[str], bool] | None = None
) -> Iterator[tuple[str, os.DirEntry[str]]]:
    """Every entry under ``top`` as (relative POSIX path, entry), parents before children.

    Never follows a symlink. ``skip`` names top-level entries to leave out.
    """
    stack: list[tuple[str, str]] = [(os.fspath(top), "")]
    while stack:
        directory, rel = stack.pop()
        with os.scandir(directory) as it:
            entries = sorted(it, key=lambda e: e.name)
        subdirs: list[tuple[str, str]] = []
        for entry in entries:
            if not rel and skip is not None and skip(entry.name):
                continue
            path = f"{rel}{entry.name}"
            yield path, entry
            if entry.is_dir(follow_symlinks=False):
                subdirs.append((entry.path, f"{path}/"))
        stack.extend(reversed(subdirs))


def sync_tree(
    top: Path,
    *,
    policy: SyncPolicy,
    checksum: str | None,
    workers: int = DEFAULT_WORKERS,
    skip: Callable[[str], bool] | None = None,
) -> list[FileEntry]:
    """List every entry under ``top``; fsync its files and subdirectories (not ``top``).

    ``skip`` says which top-level names to leave out (the marker and its
    temporary names). Returns the entries sorted by path. Any fsync error
    propagates: a failed fsync is never retried (the kernel may have dropped
    the dirty pages, so a retry that succeeds proves nothing).

    Each small file is one job (hash, then fsync); a large file's hash is a job
    of its own, so it runs while the file is being flushed (reading it back from
    the page cache costs CPU, the flush costs disk time: together they take the
    longer of the two, not the sum).
    """
    files: list[tuple[str, Path, int]] = []
    dirs: list[tuple[str, Path]] = []
    links: list[FileEntry] = []
    for rel, entry in walk(top, skip):
        st = entry.stat(follow_symlinks=False)
        if stat.S_ISREG(st.st_mode):
            files.append((rel, Path(entry.path), st.st_size))
        elif stat.S_ISDIR(st.st_mode):
            dirs.append((rel, Path(entry.path)))
        elif stat.S_ISLNK(st.st_mode):
            links.append(FileEntry(rel, "symlink", target=os.readlink(entry.path)))
        else:
            log.warning("%s is not a file, directory or symlink; it is not recorded", entry.path)

    # Largest files first, so the longest flushes start earliest.
    jobs: list[Callable[[], tuple[str, str] | None]] = []
    for rel, path, size in sorted(files, key=lambda f: -f[2]):
        if checksum and policy.durable and size >= _SPLIT:
            jobs.append(functools.partial(policy.file, path))
            jobs.append(functools.partial(_hash_file, rel, path, checksum))
        elif checksum or policy.durable:
            jobs.append(functools.partial(_sync_file, policy, rel, path, checksum))
    if policy.durable:
        jobs += [functools.partial(policy.subdir, path) for _, path in dirs]
    sums = dict(r for r in run(jobs, workers) if r is not None)
    out = [FileEntry(rel, "file", size=size, checksum=sums.get(rel)) for rel, _, size in files]
    out += [FileEntry(rel, "dir") for rel, _ in dirs]
    out += links
    return sorted(out, key=lambda e: e.path)


def _sync_file(
    policy: SyncPolicy, rel: str, path: Path, checksum: str | None
) -> tuple[str, str] | None:
    digest = checksum_file(path, checksum) if checksum else None
    policy.file(path)
    return None if digest is None else (rel, digest)


def _hash_file(rel: str, path: Path, checksum: str) -> tuple[str, str]:
    return rel, checksum_file(path, checksum)


def run(jobs: Iterable[Callable[[], _T]], workers: int) -> list[_T]:
    """Run ``jobs`` on up to ``workers`` threads, the calling thread among them; results in order.

    The first error stops the jobs not yet started, waits for the running ones
    and propagates (never retried). Plain threads, not ``concurrent.futures``:
    a commit must work at interpreter exit (an ``atexit`` handler, a pending
    async commit), where an executor refuses new work; if no thread can be
    started there, the calling thread does every job itself.
    """
    todo = list(enumerate(jobs))
    results: list[_T | None] = [None] * len(todo)
    if min(workers, len(todo)) <= 1:
        return [job() for _, job in todo]
    lock = threading.Lock()
    errors: list[BaseException] = []
    queue = iter(todo)

    def work() -> None:
        while True:
            with lock:
                if errors:
                    return
                item = next(queue, None)
            if item is None:
                return
            i, job = item
            try:
                results[i] = job()
            except BaseException as exc:
                with lock:
                    errors.append(exc)
                return

    threads: list[threading.Thread] = []
    for _ in range(min(workers, len(todo)) - 1):
        thread = threading.Thread(target=work, name="atomic_ckpt-sync", daemon=True)
        try:
            thread.start()
        except RuntimeError:  # interpreter shutdown: no new threads
            break
        threads.append(thread)
    try:
        work()
    finally:
        for thread in threads:
            thread.join()
    if errors:
        raise errors[0]
    return results  # type: ignore[return-value]
