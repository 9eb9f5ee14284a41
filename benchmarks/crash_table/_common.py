"""What every crash-table workload and check shares: the journal, the digest, the full disk.

A workload ``W.py`` makes three saves of a tiny model under ``ROOT`` (a normal one, a
rewrite of the step it just saved, and one that fails part-way through because the disk
fills up), and its check reloads ``ROOT`` through the framework's own resume path:

    python W.py save ROOT [--async]   # the run the audit records
    python W.py check ROOT            # run on every crash state: 0 fine, 1 violation

``W.workload(root, async_=False)`` and ``W.check(root)`` are the same as functions (a check
raises :class:`Violation`), for an audit that imports a check once.

The journal (``ROOT/journal/``) is how a check knows, in any crash state, what each
save wrote and which saves had returned: before a save the workload adds the entry
``begin-K-<digest of the state save K writes>``; after the framework call that made the
save returns, ``returned-K``. Each entry is an empty file made durable by an fsync of
``ROOT/journal``, which is created (and made durable) before any save: its fsyncs never
touch the checkpoints' directories.
A check then demands that what the framework loaded is the state of one single save
(its digest is one of the ``begin`` digests), and not older than a save that returned
(a returned save that a crash takes back is a lost commit). A fresh start (nothing to
load) is fine until a save has returned.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import resource
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

JOURNAL = "journal"


class Violation(Exception):
    """A crash state the check rejects: what was loaded, and why that is wrong."""


class ExpectedSaveError(Exception):
    """Raised by :func:`disk_full` when the failing save did not fail (the setup is wrong)."""


# --------------------------------------------------------------------------- digest


def _feed(h: Any, obj: Any) -> None:
    import torch

    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(obj, Mapping):
        h.update(b"{")
        for key in sorted(obj, key=str):
            h.update(repr(key).encode() + b":")
            _feed(h, obj[key])
        h.update(b"}")
    elif isinstance(obj, list | tuple):
        h.update(b"[")
        for item in obj:
            _feed(h, item)
        h.update(b"]")
    elif obj is None or isinstance(obj, bool | int | float | str | bytes):
        h.update(repr(obj).encode())
    else:
        raise TypeError(f"cannot digest {type(obj).__name__}")


def digest(obj: Any) -> str:
    """A digest of nested dicts, lists, tensors and scalars (tensor bytes, dtypes, shapes)."""
    h = hashlib.sha256()
    _feed(h, obj)
    return h.hexdigest()[:20]


# --------------------------------------------------------------------------- journal


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_journal(root: Path) -> None:
    """Create ``root/journal/`` durably, before the workload saves anything."""
    root.mkdir(parents=True, exist_ok=True)
    (root / JOURNAL).mkdir()
    _fsync_dir(root)


def _append(root: Path, entry: str) -> None:
    # An entry is an empty file whose name says it all, made durable by fsyncing its
    # directory: no file data, so no crash model can tear or zero-fill an entry, and
    # no file is ever written in place.
    os.close(os.open(root / JOURNAL / entry, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    _fsync_dir(root / JOURNAL)


def begin(root: Path, save: int, state_digest: str) -> None:
    """Record, durably, that save ``save`` starts and writes a state with ``state_digest``."""
    _append(root, f"begin-{save}-{state_digest}")


def returned(root: Path, save: int) -> None:
    """Record, durably, that the call that made save ``save`` returned without an error."""
    _append(root, f"returned-{save}")


def failed(root: Path, save: int) -> None:
    """Record that save ``save`` raised, as the workload meant it to."""
    _append(root, f"failed-{save}")


@dataclass
class Journal:
    """What the journal of one crash state says."""

    begun: dict[str, int] = field(default_factory=dict)  # digest -> save number
    returned: set[int] = field(default_factory=set)

    @classmethod
    def read(cls, root: Path) -> Journal:
        """The entries of ``root/journal/`` (none if a crash left no directory)."""
        j = cls()
        try:
            names = os.listdir(root / JOURNAL)
        except FileNotFoundError:
            return j
        for name in names:
            parts = name.split("-")
            if len(parts) == 3 and parts[0] == "begin" and parts[1].isdigit():
                j.begun[parts[2]] = int(parts[1])
            elif len(parts) == 2 and parts[0] == "returned" and parts[1].isdigit():
                j.returned.add(int(parts[1]))
        return j

    def judge(self, loaded: str | None, where: str) -> str:
        """The verdict on ``loaded`` (a state digest, None for a fresh start) or a Violation."""
        newest = max(self.returned, default=0)
        if loaded is None:
            if newest:
                raise Violation(f"lost commit: save {newest} returned, but {where} holds nothing")
            return "fresh start"
        save = self.begun.get(loaded)
        if save is None:
            raise Violation(f"bytes of no single save: {where} loaded state {loaded}")
        if save < newest:
            raise Violation(
                f"lost commit: {where} holds save {save}, but save {newest} had returned"
            )
        return f"loaded save {save} from {where}"


def judge(root: Path, loaded: str | None, where: str) -> str:
    """:meth:`Journal.judge` on ``root``'s journal."""
    return Journal.read(root).judge(loaded, where)


# --------------------------------------------------------------------------- the failing save


@contextlib.contextmanager
def disk_full(limit: int) -> Iterator[None]:
    """Inside the block, no file of this process can grow past ``limit`` bytes: a write
    across it writes what fits and then fails with EFBIG (Python ignores SIGXFSZ), as
    when a disk fills up part-way through a save. The block must raise
    (:class:`ExpectedSaveError` otherwise)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    raise ExpectedSaveError(f"the save meant to fail at {limit} bytes did not")


def failing_save(root: Path, save: int, limit: int, run: Callable[[], Any]) -> None:
    """Run save ``save`` (``run``) on a disk that fills up at ``limit`` bytes per file;
    swallow the error it raises (journal: ``failed``) so that the workload exits 0."""
    try:
        with disk_full(limit):
            run()
    except ExpectedSaveError:
        raise
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # DCP's CheckpointException is no Exception
        print(f"save {save} failed as intended: {type(exc).__name__}: {one_line(str(exc))}")
        failed(root, save)


# --------------------------------------------------------------------------- command line


def main(
    workload: Callable[..., None],
    check: Callable[[Path], str],
    argv: list[str] | None = None,
    *,
    has_async: bool = False,
) -> int:
    """``save ROOT [--async]`` runs the workload; ``check ROOT`` the check (exit 1 on a
    violation, with the reason on one line of stderr); ``save+check`` both in one
    process (for the quick test: one import of the framework, not two)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["save", "check", "save+check"])
    parser.add_argument("root", type=Path)
    if has_async:
        parser.add_argument("--async", dest="async_", action="store_true")
    args = parser.parse_args(argv)
    if args.mode.startswith("save"):
        if has_async:
            workload(args.root, async_=args.async_)
        else:
            workload(args.root)
        if args.mode == "save":
            return 0
    try:
        print(check(args.root), flush=True)
    except Violation as exc:
        print(f"VIOLATION {one_line(str(exc))}", file=sys.stderr, flush=True)
        return 1
    return 0


def one_line(text: str, limit: int = 400) -> str:
    """``text`` on one line (an exception's message can hold a traceback), shortened."""
    flat = " | ".join(part.strip() for part in text.splitlines() if part.strip())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
