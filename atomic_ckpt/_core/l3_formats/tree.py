"""Step 3 of the protocol: walk a checkpoint tree once, fsync and hash its files in parallel.

Files are fsynced on several threads: ``os.fsync`` releases the GIL, so threads
let the disk work on many files' writeback at once, and a checksum of one file
is computed while another (or the same one) is being flushed. Symlinks are
recorded, never followed, opened, fsynced or hashed. The walk is iterative, so
a legally deep tree is walked like any other.

A tree that a manifest cannot record is refused before anything is hashed
(:class:`~atomic_ckpt.ManifestError` naming the entry): a FIFO, socket or device
(nothing to checksum or carry over, and left out of the manifest it would make
the checkpoint fail its own ``verify``), or a name that is not valid UTF-8 (the
manifest is JSON text: its reader refuses such a path).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import posixpath
import queue
import stat
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import CancelledError, Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from atomic_ckpt._core.l1_names.errors import ManifestError, VerificationError
from atomic_ckpt._core.l2_syscalls.checksums import checksum_file
from atomic_ckpt._core.l3_formats.manifest import FileEntry

if TYPE_CHECKING:  # at run time this module imports nothing that writes: _read uses it
    from atomic_ckpt._core.l2_syscalls.sync import SyncPolicy


DEFAULT_WORKERS = 32
"""Threads for fsync and hashing. fsync blocks in the kernel without the GIL, so
many in flight let the disk merge work (1,000 small files here: 1 thread 221 ms,
16 threads 120 ms, 32 threads 110 ms; see benchmarks/fsync_overhead.py)."""

WRITEBACK_AT_LEAST = 1 << 20
"""From this size on, the committing thread starts its own file's writeback range by
range as it hashes it (below, the hash takes microseconds and the fsync follows at once)."""

_T = TypeVar("_T")

Identity = tuple[int, int, int]
"""A file's (inode, size, mtime in ns): what says it is still the file that was hashed."""


def identity(st: os.stat_result) -> Identity:
    """The :data:`Identity` of a file from its ``lstat``."""
    return (st.st_ino, st.st_size, st.st_mtime_ns)


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


_KINDS = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def check_recordable(rel: str, path: str | os.PathLike[str], mode: int) -> None:
    """Refuse an entry a manifest cannot record: ManifestError naming it and saying what
    to do. A checkpoint holds regular files, directories and symlinks, under names that
    are valid UTF-8 (the manifest is JSON text; its reader refuses any other path)."""
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
        kind = _KINDS.get(stat.S_IFMT(mode), "not a file, directory or symlink")
        raise ManifestError(
            f"{os.fsdecode(path)!r} is {kind}: a checkpoint holds regular files, "
            "directories and symlinks only, and a manifest cannot record it (its "
            "checkpoint would then fail verify()). Remove it or create it elsewhere, "
            "then commit again",
            path=Path(path),
        )
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        raise ManifestError(
            f"{os.fsencode(path)!r}: this name is not valid UTF-8, and a manifest (JSON "
            "text) cannot record it. Rename it (e.g. from its bytes decoded as Latin-1), "
            "then commit again",
            path=Path(path),
        ) from None


def sync_tree(
    top: Path,
    *,
    policy: SyncPolicy,
    checksum: str | None,
    workers: int = DEFAULT_WORKERS,
    skip: Callable[[str], bool] | None = None,
    then: Callable[[list[FileEntry]], None] | None = None,
    mapped: bool = False,
    known: Mapping[str, tuple[FileEntry, Identity]] | None = None,
) -> list[FileEntry]:
    """List every entry under ``top``; fsync its files and subdirectories (not ``top``).

    ``skip`` says which top-level names to leave out (the marker and its
    temporary names). Returns the entries sorted by path, once every fsync has
    returned. Any fsync error propagates: a failed fsync is never retried (the
    kernel may have dropped the dirty pages, so a retry that succeeds proves
    nothing).

    ``then(entries)`` runs in the calling thread as soon as every checksum is known,
    while the flushes may still be in flight: a commit writes its marker there, so the
    marker's own fsyncs overlap the data's instead of following them (nothing in a
    staging dir is visible before the rename, which waits for all of them); a file it
    replaces is its own to make durable. ``mapped``: ``top`` holds this process's own
    files (a commit's staging dir), which may be hashed through a mapping. Hashes are
    queued first, then the flushes, largest file first: the other files are hashed (CPU,
    from the page cache) while they are flushed (disk). The largest is the calling
    thread's own: the writeback of each of its ranges is started just before that range
    is hashed (``policy.start_file``), so the disk writes while the CPU hashes, and it
    is fsynced there too, after ``then``: a one-file commit without subdirectories runs
    on one thread.

    ``known``: files whose entry is already known (carried from a committed checkpoint:
    relative path -> (entry, the :data:`Identity` it had when carried)). Each is fsynced
    but not hashed while it still has that identity; one replaced by another file is
    hashed like any; one with the same inode but another size or time was written in
    place, through a link shared with a committed checkpoint: VerificationError.
    Every file's entry records the identity it had before it was hashed.
    """
    files: list[tuple[str, Path, int]] = []
    dirs: list[tuple[str, Path]] = []
    links: list[FileEntry] = []
    ids: dict[str, Identity] = {}
    for rel, entry in walk(top, skip):
        st = entry.stat(follow_symlinks=False)
        check_recordable(rel, entry.path, st.st_mode)
        if stat.S_ISREG(st.st_mode):
            files.append((rel, Path(entry.path), st.st_size))
            ids[rel] = identity(st)
        elif stat.S_ISDIR(st.st_mode):
            dirs.append((rel, Path(entry.path)))
        else:
            links.append(FileEntry(rel, "symlink", target=os.readlink(entry.path)))
    return _flush(
        files,
        dirs,
        links,
        policy=policy,
        checksum=checksum,
        workers=workers,
        then=then,
        mapped=mapped,
        ids=ids,
        known=_trusted(top, known or {}, ids),
    )


def _trusted(
    top: Path, known: Mapping[str, tuple[FileEntry, Identity]], ids: Mapping[str, Identity]
) -> dict[str, FileEntry]:
    """The entries of ``known`` whose file is still the one carried (see :func:`sync_tree`)."""
    out: dict[str, FileEntry] = {}
    for rel, (entry, carried) in known.items():
        now = ids.get(rel)
        if now == carried:
            out[rel] = entry
        elif now is not None and now[0] == carried[0]:
            raise VerificationError(
                f"{top / rel} was carried from a committed checkpoint and then written in "
                "place: it shares its storage with that checkpoint, which is now damaged "
                "too (run verify() on it). Replace a carried file by writing a new file and "
                "renaming it over, never by opening it for writing. Nothing was committed",
                path=top / rel,
                problems=(f"{rel}: written in place after it was carried",),
            )
    return out


def _flush(
    files: list[tuple[str, Path, int]],
    dirs: list[tuple[str, Path]],
    links: list[FileEntry],
    *,
    policy: SyncPolicy,
    checksum: str | None,
    workers: int,
    then: Callable[[list[FileEntry]], None] | None = None,
    mapped: bool = False,
    ids: Mapping[str, Identity] | None = None,
    known: Mapping[str, FileEntry] | None = None,
) -> list[FileEntry]:
    """fsync and hash ``files`` (relative path, path, size) and fsync ``dirs`` in parallel;
    the manifest entries of all three sorted by path (``then`` as in :func:`sync_tree`).
    ``ids``: each file's identity before it was hashed, recorded in its entry; ``known``:
    the entries of files not to hash (carried).

    ``mapped``: the files are this process's own, which nobody truncates while they are
    hashed, so they may be hashed through a mapping (see ``checksum_file``)."""
    files = sorted(files, key=lambda f: -f[2])
    # The largest file is this thread's: it is hashed here, each range's writeback
    # started just before that range is hashed (so the disk writes while the CPU
    # hashes), and (after ``then``) fsynced here, with no thread started or waited on
    # for it: a one-file commit starts no thread at all (a handoff to a thread and back
    # cost more than the thread saved on a 64 MiB commit here).
    largest = files[0] if files else None
    known = known or {}
    ids = ids or {}
    hashing, algorithm = (files, checksum) if checksum is not None else ([], "")
    hashing = [f for f in hashing if f[0] not in known]
    if hashing and largest is not None and hashing[0] is not largest:
        largest = None  # the largest is carried: no writeback to overlap with its hash
    with Workers(workers) as pool:
        queued = {
            rel: pool.submit(functools.partial(checksum_file, path, algorithm, mapped=mapped))
            for rel, path, _ in hashing[1:]
        }
        flushes: list[Future[None]] = []
        ahead: Callable[[int, int], None] | None = None
        if policy.durable:
            flushes += [pool.submit(functools.partial(policy.file, p)) for _, p, _ in files[1:]]
            flushes += [pool.submit(functools.partial(policy.subdir, path)) for _, path in dirs]
            if largest is not None and largest[2] >= WRITEBACK_AT_LEAST:
                ahead = functools.partial(policy.start_file, largest[1])
                if not hashing:
                    ahead(0, 0)  # nothing to hash meanwhile: all of it at once
        sums = {
            rel: checksum_file(path, algorithm, mapped=mapped, ahead=ahead)
            for rel, path, _ in hashing[:1]
        }
        sums.update((rel, pool.result(job)) for rel, job in queued.items())
        out = [
            _entry(rel, size, sums.get(rel), ids.get(rel), known.get(rel)) for rel, _, size in files
        ]
        out += [FileEntry(rel, "dir") for rel, _ in dirs]
        out += links
        out.sort(key=lambda e: e.path)
        if then is not None:
            then(out)
        lead = files[0] if files else None
        # Unless ``then`` replaced it (dedup: a link, durable with its directory's fsync).
        if policy.durable and lead and ids.get(lead[0]) in (None, identity(os.lstat(lead[1]))):
            policy.file(lead[1])
        for flush in flushes:
            pool.result(flush)
    return out


def _entry(
    rel: str, size: int, checksum: str | None, ident: Identity | None, known: FileEntry | None
) -> FileEntry:
    """A file's manifest entry: the carried one (with the carrier's identity), or a new one."""
    ino, mtime = (ident[0], ident[2]) if ident is not None else (None, None)
    if known is not None:
        return dataclasses.replace(known, ino=ino, mtime_ns=mtime)
    return FileEntry(rel, "file", size=size, checksum=checksum, ino=ino, mtime_ns=mtime)


def list_tree(top: Path, skip: Callable[[str], bool] | None = None) -> list[FileEntry]:
    """Every entry under ``top`` with its type and size, sorted by path: no fsync, no read.

    What a coordinator checks other ranks' declarations against (PROTOCOL.md, several
    ranks): a directory listing and one ``lstat`` per entry, never a file's data.
    """
    out: list[FileEntry] = []
    for rel, entry in walk(top, skip):
        st = entry.stat(follow_symlinks=False)
        check_recordable(rel, entry.path, st.st_mode)
        if stat.S_ISREG(st.st_mode):
            out.append(FileEntry(rel, "file", size=st.st_size))
        elif stat.S_ISDIR(st.st_mode):
            out.append(FileEntry(rel, "dir"))
        else:
            out.append(FileEntry(rel, "symlink", target=os.readlink(entry.path)))
    out.sort(key=lambda e: e.path)
    return out


def sync_files(
    top: Path,
    paths: Iterable[str],
    *,
    policy: SyncPolicy,
    checksum: str | None,
    workers: int = DEFAULT_WORKERS,
    mapped: bool = False,
) -> list[FileEntry]:
    """Step 3 for the named entries of ``top`` only: fsync (and hash) each, once.

    ``paths`` are relative POSIX paths below ``top``: a regular file is fsynced and
    hashed, a directory fsynced (its entries, not its contents), a symlink recorded.
    For a rank of a multi-rank commit, which flushes exactly what it wrote. Returns
    their manifest entries sorted by path; a missing entry raises FileNotFoundError, one a
    manifest cannot record ManifestError (see :func:`check_recordable`).
    Like :func:`sync_tree`, the hashes are queued before the flushes; ``mapped`` as there.
    """
    files: list[tuple[str, Path, int]] = []
    dirs: list[tuple[str, Path]] = []
    links: list[FileEntry] = []
    ids: dict[str, Identity] = {}
    real_top = os.path.realpath(top)
    for rel in sorted(set(paths)):
        path = top / rel
        # A normalized relative path whose parents are real directories, never links.
        parent = os.path.dirname(rel)
        if (
            posixpath.normpath(rel) != rel
            or rel.startswith(("/", "../"))
            or rel in ("", ".", "..")
            or os.path.realpath(path.parent) != os.path.join(real_top, parent).rstrip("/")
        ):
            raise ValueError(f"{rel!r} is not an entry below {top} (absolute, '..' or a link)")
        st = os.lstat(path)
        check_recordable(rel, path, st.st_mode)
        if stat.S_ISREG(st.st_mode):
            files.append((rel, path, st.st_size))
            ids[rel] = identity(st)
        elif stat.S_ISDIR(st.st_mode):
            dirs.append((rel, path))
        else:
            links.append(FileEntry(rel, "symlink", target=os.readlink(path)))
    return _flush(
        files,
        dirs,
        links,
        policy=policy,
        checksum=checksum,
        workers=workers,
        mapped=mapped,
        ids=ids,
    )


class Workers:
    """Up to ``n`` threads running submitted jobs in order (inline when ``n`` is 1).

    Plain threads, not a ``ThreadPoolExecutor``: a commit must work at interpreter
    exit (an ``atexit`` handler, a pending async commit), where an executor refuses
    new work; if no thread can be started there, the jobs run in the caller's
    thread. After the first failure the jobs not yet started are cancelled;
    leaving the ``with`` block waits for the running ones.
    """

    def __init__(self, n: int) -> None:
        self._n = n
        self._queue: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None]
        self._queue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._failed = False
        self._error: BaseException | None = None

    def submit(self, job: Callable[[], _T]) -> Future[_T]:
        future: Future[_T] = Future()
        if self._n <= 1:
            self._do(future, job)
            return future
        self._queue.put((future, job))
        if len(self._threads) < self._n:
            thread = threading.Thread(target=self._work, name="atomic_ckpt-sync", daemon=True)
            try:
                thread.start()
            except RuntimeError:  # interpreter shutdown: no new threads
                self._n = len(self._threads)
                if not self._threads:
                    self._drain()
                return future
            self._threads.append(thread)
        return future

    def _do(self, future: Future[_T], job: Callable[[], _T]) -> None:
        if self._failed or not future.set_running_or_notify_cancel():
            future.cancel()
            return
        try:
            future.set_result(job())
        except BaseException as exc:
            self._failed = True
            if self._error is None:
                self._error = exc
            future.set_exception(exc)

    def result(self, future: Future[_T]) -> _T:
        """``future``'s result. A job cancelled because another one failed raises that
        failure (the first), never a bare ``CancelledError`` that would hide it."""
        try:
            return future.result()
        except CancelledError:
            if self._error is not None:
                raise self._error from None
            raise

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            self._do(*item)

    def _drain(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                self._do(*item)

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if exc_info[0] is not None:
            self._failed = True  # the caller gave up: start nothing more
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join()
        self._drain()  # anything left when no thread could start


def run(jobs: Iterable[Callable[[], _T]], workers: int) -> list[_T]:
    """Run ``jobs`` on up to ``workers`` threads; their results in order.

    The first error cancels the jobs not yet started, waits for the running
    ones and propagates (never retried).
    """
    with Workers(workers) as pool:
        futures = [pool.submit(job) for job in jobs]
        return [pool.result(future) for future in futures]
