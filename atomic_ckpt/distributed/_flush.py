"""Which rank flushes which file in a multi-rank commit (steps 4 and 5 of
:func:`atomic_ckpt.distributed.distributed_commit`; see its module's notes).

The registry of the paths each rank declared (with ``rank_path`` or ``declare``);
step 4, where every rank fsyncs and hashes what it declared; step 5, the fallback
sweep of what no rank declared, with the check that every rank sees the same
listing; and the marker's entries built from both.
(Private: used by :mod:`atomic_ckpt.distributed`.)
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from atomic_ckpt import CheckpointDir, CommitStateError, DistributedCommitError, FileEntry
from atomic_ckpt.distributed._ranks import (
    _describe,
    _failures,
    _Ranks,
    checked_listing,
    raise_failures,
)


class Declared:
    """The paths each open staging directory's rank declared (this process's commits).

    ``explicit``: :func:`~atomic_ckpt.distributed.declare` was called, so the rank vouches
    for having declared everything it wrote; names from
    :func:`~atomic_ckpt.distributed.rank_path` alone do not (existing code may
    write other files beside them, which the rank must still flush itself).
    """

    _lock = threading.Lock()
    _open: dict[Path, Declared] = {}  # noqa: RUF012 (one registry per process)

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.explicit = False

    @classmethod
    def open(cls, staging: Path) -> Declared:
        with cls._lock:
            return cls._open.setdefault(staging, cls())

    @classmethod
    def close(cls, staging: Path) -> None:
        with cls._lock:
            cls._open.pop(staging, None)

    @classmethod
    def add(cls, path: Path, *, strict: bool) -> None:
        full = Path(os.path.abspath(path))
        with cls._lock:
            for staging, declared in cls._open.items():
                if full.is_relative_to(staging) and full != staging:
                    declared.names.add(full.relative_to(staging).as_posix())
                    declared.explicit |= strict
                    return
        if strict:
            raise CommitStateError(
                f"declare({str(path)!r}): the path is not inside the staging directory of "
                "an open distributed_commit in this process; declare the files written "
                "inside the `with distributed_commit(...) as path:` block, below path"
            )


def flush_declared(
    ckpts: CheckpointDir, ranks: _Ranks, step: int, staging: Path, names: set[str]
) -> dict[str, FileEntry]:
    """Step 4: this rank fsyncs and hashes what it declared (each file once, by its
    writer); the ranks exchange their entries and outcomes.

    Returns every rank's entries by path (for a path declared twice, the lower rank's).
    """
    mine: BaseException | None = None
    synced: list[FileEntry] = []
    try:
        synced = ckpts.sync_files(staging, _expand(ckpts, staging, names))
    except Exception as exc:
        mine = exc
    gathered = ranks.all_gather(
        (_describe(mine), synced), "agreeing that every rank flushed its files"
    )
    failed = _failures([g[0] for g in gathered])
    raise_failures(mine, failed, rank=ranks.rank, step=step, phase="while flushing")
    declared: dict[str, FileEntry] = {}
    for _, entries in gathered:
        for e in entries:
            declared.setdefault(e.path, e)
    return declared


def sweep_undeclared(
    ckpts: CheckpointDir,
    ranks: _Ranks,
    step: int,
    staging: Path,
    declared: dict[str, FileEntry],
    *,
    declared_all: bool,
) -> tuple[list[FileEntry], list[dict[str, str]]]:
    """Step 5: the fallback sweep of what no rank declared (see :func:`_sweep`); the
    ranks exchange their listings' digests, checksums and outcomes, and a listing that
    differs from rank 0's is an error.

    Returns the listing and every rank's share of the checksums.
    """
    mine: BaseException | None = None
    digest: str | None = None
    listing: list[FileEntry] = []
    sums: dict[str, str] = {}
    try:
        digest, listing, sums = _sweep(
            ckpts,
            staging,
            declared,
            rank=ranks.rank,
            size=ranks.size,
            declared_all=declared_all,
        )
    except Exception as exc:
        mine = exc
    gathered = ranks.all_gather(
        (_describe(mine), digest, sums),
        "agreeing that every rank flushed the undeclared files",
    )
    failed = _failures([g[0] for g in gathered])
    raise_failures(mine, failed, rank=ranks.rank, step=step, phase="while flushing")
    digests = [g[1] for g in gathered]
    differ = [r for r, d in enumerate(digests) if d != digests[0]]
    if differ:
        raise DistributedCommitError(
            f"the commit of step {step} failed: rank(s) {differ} see different files in "
            f"{staging} than rank 0 after the barrier. The filesystem must show every "
            "rank the same directory listing once all have written (on NFS, mount "
            "with lookupcache=positive or actimeo=0). Nothing was promoted",
            step=step,
            ranks=tuple(differ),
        )
    return listing, [g[2] for g in gathered]


def marker_files(
    listing: list[FileEntry], declared: dict[str, FileEntry], shares: list[dict[str, str]]
) -> list[FileEntry]:
    """The marker's entries: each declared file as its writer recorded it, every other
    entry of the listing with the checksum the sweep computed for it."""
    sums: dict[str, str] = {}
    for share in shares:
        sums.update(share)
    return [declared.get(e.path) or _with_checksum(e, sums) for e in listing]


def _expand(ckpts: CheckpointDir, staging: Path, declared: set[str]) -> list[str]:
    """The declared paths that exist, a declared directory with everything below it."""
    out: list[str] = []
    for rel in sorted(declared):
        path = staging / rel
        if not os.path.lexists(path):
            continue  # named with rank_path but never written: nothing to flush
        out.append(rel)
        if path.is_dir() and not path.is_symlink():
            out += [f"{rel}/{e.path}" for e in ckpts.list_tree(path)]
    return out


def _sweep(
    ckpts: CheckpointDir,
    staging: Path,
    declared: dict[str, FileEntry],
    *,
    rank: int,
    size: int,
    declared_all: bool,
) -> tuple[str, list[FileEntry], dict[str, str]]:
    """Step 5 on one rank: list the tree, check the declared files against it, fsync the
    undeclared files (rank 0, and a rank that did not call declare()) and, on rank 0, the
    undeclared directories; hash this rank's share of the undeclared files.

    Returns a digest of the listing (to compare across ranks), the listing, and the
    checksums of this rank's share.
    """
    listing = checked_listing(ckpts, staging, declared, viewer=f"rank {rank}")
    undeclared = [e.path for e in listing if e.type == "file" and e.path not in declared]
    flush = list(undeclared) if rank == 0 or not declared_all else []
    if rank == 0:
        flush += [e.path for e in listing if e.type == "dir" and e.path not in declared]
    if flush:
        ckpts.sync_files(staging, flush, hash=False)
    share = undeclared[rank::size]
    sums: dict[str, str] = {}
    if ckpts.checksum is not None and share:
        with ThreadPoolExecutor(max_workers=min(8, len(share))) as pool:
            hashes = pool.map(lambda rel: ckpts.checksum_file(staging / rel) or "", share)
            sums = dict(zip(share, hashes, strict=True))
    body = json.dumps([e.to_json() for e in listing]).encode()
    return hashlib.sha256(body).hexdigest(), listing, sums


def _with_checksum(entry: FileEntry, sums: dict[str, str]) -> FileEntry:
    if entry.type != "file" or entry.path not in sums:
        return entry
    return FileEntry(entry.path, "file", size=entry.size, checksum=sums[entry.path])
