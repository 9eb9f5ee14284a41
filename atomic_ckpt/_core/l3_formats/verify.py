"""Verify a checkpoint against its manifest in one pass: walk the tree, hash each
file as it is found (in parallel, each file read once), parse the file list
meanwhile, then compare; report every mismatch, with progress. Read-only."""

from __future__ import annotations

import functools
import logging
import os
import stat
import threading
from collections.abc import Collection
from concurrent.futures import Future, wait
from pathlib import Path
from typing import Literal, NamedTuple

from atomic_ckpt._core.l1_names.errors import ManifestError, VerificationError
from atomic_ckpt._core.l1_names.names import MARKER, is_marker_name
from atomic_ckpt._core.l2_syscalls.checksums import CHECKSUMS, checksum_file, hashed_size, map_file
from atomic_ckpt._core.l3_formats.manifest import FileEntry, Manifest
from atomic_ckpt._core.l3_formats.read import PROGRESS_INTERVAL, Checkpoint, Progress
from atomic_ckpt._core.l3_formats.tree import Workers, walk

log = logging.getLogger(__name__)


def verify(
    ckpt: Checkpoint,
    *,
    workers: int,
    progress: Progress | None = None,
    keep: Collection[str] = (),
    only: Collection[str] | None = None,
    hashed_elsewhere: Collection[str] = (),
) -> dict[str, memoryview]:
    """Check every entry of ``ckpt``'s manifest against the disk, and that nothing was added.

    Returns the bytes of the regular files named in ``keep`` (paths relative to the
    checkpoint) as they were read and hashed: a loader handed them reads nothing
    again, so a verified load reads each byte from storage once. Other files are
    hashed and dropped.

    The work can be split among processes (the ranks of
    ``atomic_ckpt.distributed.resume_verified``), whose parts together make one whole
    verify: ``only`` checks just the manifest's entries at those paths (paths it does
    not list are ignored; the tree is not walked, so nothing is reported as added;
    each path is looked up without following a symlink on its way), with the marker's
    own checks; ``hashed_elsewhere`` names regular files whose bytes another process
    hashes (unless also in ``keep``): here their type and size are checked, and
    nothing of them is read.

    One pass over the tree as it is on disk: it is walked (never through a
    symlink) and its regular files are hashed on ``workers`` threads as they are
    found, each read once (opened without following a symlink or blocking on a
    FIFO; its size is what was read), while the manifest's file list is parsed;
    then the two are compared. Files that are not in the manifest are read too
    (they are reported as added). Raises one :class:`VerificationError` listing every
    problem (missing, wrong type, size or checksum, unexpected entries; or a
    damaged marker body, with the :class:`ManifestError` as its cause). A legacy
    (empty) marker has nothing to check against.

    ``progress(done, total)`` is called in the calling thread with the bytes of
    regular files checked so far and their total (the manifest's sizes): once
    at the start, about every :data:`PROGRESS_INTERVAL` seconds, and once at the
    end with ``done == total``.
    """
    m = ckpt.manifest
    if m.legacy:
        if progress is not None:
            progress(0, 0)
        return {}
    found: list[tuple[Path, str]] = []  # (the path at fault, what is wrong)
    if m.step != ckpt.step:  # (a legacy marker records nothing: it returned above)
        found.append(
            (ckpt.path, f"manifest records step {m.step}, but the directory is step {ckpt.step}")
        )
    algorithm = m.checksum
    if algorithm is not None and algorithm not in CHECKSUMS:
        found.append((ckpt.path, f"cannot check checksums of algorithm {algorithm!r} here"))
        algorithm = None
    meter = None if progress is None else _Meter(m.total_size)  # the header's: nothing parsed
    if progress is not None and meter is not None and only is None:
        progress(0, meter.total)
    top = os.fspath(ckpt.path)
    elsewhere = frozenset(hashed_elsewhere).difference(keep)
    with Workers(workers) as pool:
        if only is None:
            disk, jobs, listing_error = _walk_and_hash(
                pool,
                top,
                m=m,
                algorithm=algorithm,
                meter=meter,
                workers=workers,
                keep=keep,
                elsewhere=elsewhere,
            )
            if listing_error is not None:
                found.append((ckpt.path, f"cannot list the checkpoint: {listing_error}"))
        try:  # parsed here, while the workers read
            files = m.files
        except ManifestError as exc:
            damaged = f"{ckpt.path / MARKER}: {exc}"
            raise VerificationError(
                damaged, path=ckpt.path / MARKER, step=ckpt.step, problems=(damaged,)
            ) from exc
        if only is not None:
            wanted = set(only)
            files = tuple(e for e in files if e.path in wanted)
            if progress is not None and meter is not None:  # this part's bytes, to read
                meter.total = sum(
                    e.size for e in files if e.type == "file" and e.path not in elsewhere
                )
                progress(0, meter.total)
            disk, jobs = _look_up_and_hash(
                pool, top, files, algorithm=algorithm, meter=meter, keep=keep, elsewhere=elsewhere
            )
        if progress is not None and meter is not None:
            pending = set(jobs)
            while pending:
                pending = wait(pending, timeout=PROGRESS_INTERVAL).not_done
                progress(min(meter.done, meter.total), meter.total)
        kept: dict[str, memoryview] = {}
        for job in jobs:
            for rel, on_disk, data in pool.result(job):
                disk[rel] = on_disk
                if data is not None:
                    kept[rel] = data
    if progress is not None and meter is not None and meter.done < meter.total:
        progress(meter.total, meter.total)  # files not read (missing, no checksum) count too
    for entry in files:
        hashed = None if entry.path in elsewhere else algorithm
        problem = _compare(top, entry, disk.get(entry.path), hashed)
        if problem is not None:
            found.append((ckpt.path / entry.path, problem))
    listed = {e.path for e in files}
    found += [
        (ckpt.path / rel, "not in the manifest (added after the commit)")
        for rel in disk
        if rel not in listed
    ]  # (a part, ``only``, looked up its listed paths alone: nothing here)
    if found:
        problems = tuple(f"{path}: {why}" for path, why in found)
        more = f" (and {len(found) - 1} more: see .problems)" if len(found) > 1 else ""
        raise VerificationError(
            problems[0] + more, path=found[0][0], step=ckpt.step, problems=problems
        )
    return kept


class _OnDisk(NamedTuple):
    """What verify found at one path: its kind and, for a regular file, size and digest."""

    kind: Literal["file", "dir", "symlink", "other"]
    size: int = 0
    digest: str | None = None
    error: str | None = None
    """Why a regular file could not be read (it vanished, EACCES, ...)."""


_DIR, _SYMLINK, _OTHER = _OnDisk("dir"), _OnDisk("symlink"), _OnDisk("other")

_Hashed = tuple[str, _OnDisk, memoryview | None]
"""A worker's answer for one file: its path, what was found, and its bytes if kept."""


_BATCH_FILES = 64
_LARGE = 8 << 20


def _walk_and_hash(
    pool: Workers,
    top: str,
    *,
    m: Manifest,
    algorithm: str | None,
    meter: _Meter | None,
    workers: int,
    keep: Collection[str] = (),
    elsewhere: Collection[str] = (),
) -> tuple[dict[str, _OnDisk], list[Future[list[_Hashed]]], OSError | None]:
    """Walk ``top``; hand its regular files to ``pool`` in batches as they are found.

    A job per 64 KiB file cost more in thread handoffs than hashing it, so small
    files go in batches of consecutive names (at least four jobs a thread, at
    most 64 files, one file a job once they average 8 MiB: the manifest's header
    tells), keeping as many reads in flight as there are threads. The files of
    ``elsewhere`` (hashed by another process) are only sized, in jobs of their own.
    """
    count = max(m.file_count, 1)
    per_job = (
        1 if m.total_size // count >= _LARGE else max(1, min(_BATCH_FILES, count // (4 * workers)))
    )
    disk: dict[str, _OnDisk] = {}
    jobs: list[Future[list[_Hashed]]] = []
    kept: list[str] = []
    sized: list[str] = []
    batch: list[str] = []
    error: OSError | None = None
    try:
        for rel, de in walk(Path(top), is_marker_name):
            if de.is_dir(follow_symlinks=False):
                disk[rel] = _DIR
            elif de.is_symlink():
                disk[rel] = _SYMLINK
            elif de.is_file(follow_symlinks=False):
                if rel in keep:  # mapped and kept: the loader gets the pages hashed
                    kept.append(rel)
                    continue
                if rel in elsewhere:  # another process reads it: its size is enough here
                    sized.append(rel)
                    continue
                batch.append(rel)
                if len(batch) >= per_job:
                    jobs.append(pool.submit(functools.partial(_hash, top, batch, algorithm, meter)))
                    batch = []
            else:
                disk[rel] = _OTHER
    except OSError as exc:
        error = exc
    if batch:
        jobs.append(pool.submit(functools.partial(_hash, top, batch, algorithm, meter)))
    for start in range(0, len(sized), _BATCH_FILES):  # an lstat each: no data read
        chunk = sized[start : start + _BATCH_FILES]
        jobs.append(pool.submit(functools.partial(_hash, top, chunk, None, None)))
    if kept:
        # One job for all of them, one file after the other: these are a loader's large
        # files, and two cold sequential streams at once read slower here than one
        # (1 GiB cold: 0.7 s alone, 2.3 s side by side on this VM's disk).
        jobs.append(pool.submit(functools.partial(_read, top, kept, algorithm, meter)))
    return disk, jobs, error


def _look_up_and_hash(
    pool: Workers,
    top: str,
    entries: tuple[FileEntry, ...],
    *,
    algorithm: str | None,
    meter: _Meter | None,
    keep: Collection[str],
    elsewhere: Collection[str],
) -> tuple[dict[str, _OnDisk], list[Future[list[_Hashed]]]]:
    """A part of a verify (``only``): look up each of ``entries``' paths as the walk would
    see it, and hand the regular files among them to ``pool`` as the walk does."""
    disk: dict[str, _OnDisk] = {}
    dirs: dict[str, bool] = {}
    kept: list[str] = []
    batch: list[str] = []
    for entry in entries:
        on_disk = _look_up(top, entry.path, dirs)
        if on_disk is None:
            continue  # not there for the walk either: _compare says why
        if on_disk.kind != "file" or entry.path in elsewhere:
            disk[entry.path] = on_disk  # (a regular file's lstat size: no data read)
        elif entry.path in keep:
            kept.append(entry.path)
        else:
            batch.append(entry.path)
    jobs = [
        pool.submit(functools.partial(_hash, top, batch[i : i + _BATCH_FILES], algorithm, meter))
        for i in range(0, len(batch), _BATCH_FILES)
    ]
    if kept:  # (one job, one file after the other: see _walk_and_hash)
        jobs.append(pool.submit(functools.partial(_read, top, kept, algorithm, meter)))
    return disk, jobs


def _look_up(top: str, rel: str, dirs: dict[str, bool]) -> _OnDisk | None:
    """What the walk would find at ``rel`` (None: nothing), by lstat, never through a
    symlink: each directory on its way must be a real one (``dirs`` caches the answers)."""
    parts = rel.split("/")
    for depth in range(1, len(parts)):
        parent = "/".join(parts[:depth])
        if parent not in dirs:
            try:
                dirs[parent] = stat.S_ISDIR(os.lstat(f"{top}/{parent}").st_mode)
            except OSError:
                dirs[parent] = False
        if not dirs[parent]:
            return None
    try:
        st = os.lstat(f"{top}/{rel}")
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        return _OnDisk("other", error=exc.strerror or str(exc))
    if stat.S_ISREG(st.st_mode):
        return _OnDisk("file", st.st_size)
    if stat.S_ISDIR(st.st_mode):
        return _DIR
    return _SYMLINK if stat.S_ISLNK(st.st_mode) else _OTHER


def _read(top: str, rels: list[str], algorithm: str | None, meter: _Meter | None) -> list[_Hashed]:
    """Size, checksum and the mapped bytes of the files a loader asked for, in turn (as
    one worker job)."""
    out: list[_Hashed] = []
    for rel in rels:
        try:
            data, digest = map_file(
                f"{top}/{rel}", algorithm, on_read=None if meter is None else meter.add
            )
        except (OSError, ValueError) as exc:  # ValueError: mmap of a file that just shrank
            why = getattr(exc, "strerror", None) or str(exc)
            out.append((rel, _OnDisk("file", error=why), None))
            continue
        out.append((rel, _OnDisk("file", len(data), digest), data))
    return out


def _hash(top: str, batch: list[str], algorithm: str | None, meter: _Meter | None) -> list[_Hashed]:
    """Size and checksum of each regular file of ``batch`` (as a worker job).

    Kept lean: with many threads on few cores the GIL serializes this Python
    code, and a cold read of many small files shows every microsecond of it.
    """
    out: list[_Hashed] = []
    lstat, is_regular, on_read = os.lstat, stat.S_ISREG, None if meter is None else meter.add
    for rel in batch:
        path = f"{top}/{rel}"  # strings: pathlib's joins cost more than a small file's hash
        try:
            digest = size = None
            if algorithm is not None:
                # Opened without following a symlink and without blocking (a FIFO put
                # in the file's place since the walk reads as empty); its size is what
                # was read up to the end, so no lstat of its own.
                if on_read is None:  # (a plain call: the tests wrap checksum_file)
                    digest = checksum_file(path, algorithm)
                else:
                    digest = checksum_file(path, algorithm, on_read=on_read)
                size = hashed_size()
            if size is None:
                st = lstat(path)  # the walk saw a regular file; it may have changed since
                if not is_regular(st.st_mode):
                    out.append((rel, _OTHER, None))
                    continue
                size = st.st_size
            out.append((rel, _OnDisk("file", size, digest), None))
        except OSError as exc:
            out.append((rel, _OnDisk("file", error=exc.strerror or str(exc)), None))
    return out


def _compare(
    top: str, entry: FileEntry, found: _OnDisk | None, algorithm: str | None
) -> str | None:
    """Why ``entry`` does not match what the walk ``found`` at its path, or None."""
    if found is None:
        return _why_missing(top, entry.path)
    if found.kind == "other" and found.error is not None:  # (a part's lookup failed)
        return f"cannot be looked up: {found.error}"
    if entry.type == "dir":
        return None if found.kind == "dir" else "should be a directory"
    if entry.type == "symlink":
        if found.kind != "symlink":
            return "should be a symlink"
        try:
            points_to = os.readlink(f"{top}/{entry.path}")
        except OSError as exc:
            return f"cannot be read: {exc.strerror}"
        if points_to != entry.target:
            return f"symlink points to {points_to!r}, not {entry.target!r}"
        return None
    if found.kind != "file":
        return "should be a regular file"
    if found.error is not None:
        return f"cannot be read: {found.error}"
    if found.size != entry.size:
        return f"size is {found.size}, manifest says {entry.size}"
    if algorithm is not None and entry.checksum is not None and found.digest != entry.checksum:
        return f"{algorithm} checksum is {found.digest}, manifest says {entry.checksum}"
    return None


def _why_missing(top: str, rel: str) -> str:
    """The message for a manifest entry the walk did not find."""
    current = top
    for part in rel.split("/")[:-1]:
        current = f"{current}/{part}"
        try:
            st = os.lstat(current)
        except OSError:
            return "missing (its directory is gone)"
        if not stat.S_ISDIR(st.st_mode):
            return f"{part} on its path is not a directory"
    return "missing"


class _Meter:
    """Bytes read so far, added to by the verify threads."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.done += n
