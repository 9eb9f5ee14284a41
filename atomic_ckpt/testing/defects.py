"""The defects an outside attack put back into the operations above the protocol (retention,
prune, clean, amend, joins, carry, dedup, the best pointer, reading, the async committer,
aliases, the old copy of a replace), each a context manager that patches the library for
a with block; :data:`~atomic_ckpt.testing.mutants.API_MUTANTS` names them."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from atomic_ckpt import AsyncCommitter, CheckpointDir, Commit
from atomic_ckpt._core.l1_names.errors import CheckpointNotFoundError
from atomic_ckpt._core.l1_names.names import TAG_STAGING, parse_tmp
from atomic_ckpt._core.l2_syscalls import fs as _fs
from atomic_ckpt._core.l2_syscalls import share as _share
from atomic_ckpt._core.l3_formats.read import Checkpoint, scan
from atomic_ckpt._core.l3_formats.tree import identity
from atomic_ckpt._core.l4_protocol import amend as _amend
from atomic_ckpt._core.l4_protocol import carry as _carry
from atomic_ckpt._core.l4_protocol import commit as _commit
from atomic_ckpt._core.l4_protocol import dedup as _dedup
from atomic_ckpt._core.l4_protocol import delete as _delete
from atomic_ckpt._core.l4_protocol import joining as _joining
from atomic_ckpt._core.l4_protocol import repair as _repair
from atomic_ckpt._core.l4_protocol.retention import Plan, RetentionPolicy

__all__ = ["DEFECTS"]


@contextlib.contextmanager
def patched(obj: object, name: str, value: object) -> Iterator[None]:
    """``obj.name`` is ``value`` for the duration of a with block (every mutant's patch)."""
    saved = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, saved)


@contextlib.contextmanager
def _retention_drops_latest() -> Iterator[None]:
    """A retention keeps only what its rules name: the latest step is not always kept
    (``keep_every=2`` deletes an odd latest step)."""

    def plan(self: RetentionPolicy, found: Any, *, protect: int | None = None) -> Plan:
        steps = [c.step for c in found]
        keep = {protect} if protect is not None else set()
        if self.keep_last is not None:
            keep.update(steps[-self.keep_last :])
        if self.keep_every is not None:
            keep.update(s for s in steps if s % self.keep_every == 0)
        return Plan(delete=[c for c in found if c.step not in keep])

    with patched(RetentionPolicy, "plan", plan):
        yield


@contextlib.contextmanager
def _prune_counts_unmarked() -> Iterator[None]:
    """Retention ranks unmarked step directories with the complete ones, and deletes
    those its policy does not keep (a legacy checkpoint, an interrupted save's files)."""

    def complete(root: Path, prefix: str, warned: set[Path]) -> list[Checkpoint]:
        return [
            Checkpoint(e.step, e.path, e.manifest)  # type: ignore[arg-type]
            for e in scan(root, prefix)
            if e.step is not None and e.status in ("complete", "unmarked")
        ]

    with patched(_delete, "complete", complete):
        yield


@contextlib.contextmanager
def _clean_force_live() -> Iterator[None]:
    """``clean(force=True)`` also claims staging dirs whose writer is alive (their lock
    held, here by an open commit of this very process)."""
    real = _repair.orphans

    def orphans(root: Any, *, dry_run: bool, force: bool = False) -> Any:
        found = real(root, dry_run=dry_run, force=force)
        if force and not dry_run:
            have = {p for p, _ in found}
            for name in sorted(os.listdir(root.path)):
                tmp = parse_tmp(name)
                if tmp is None or tmp.tag != TAG_STAGING or tmp.is_lock:
                    continue
                if root.path / name not in have:
                    found.append((root.path / name, None))
        return found

    with patched(_repair, "orphans", orphans):
        yield


@contextlib.contextmanager
def _amend_drops_nested() -> Iterator[None]:
    """An amend carries over only the committed files at the top of the checkpoint: those
    in subdirectories are lost."""
    real = _amend.carry_over

    def carry_over(root: Any, base: Checkpoint, *args: Any, **kw: Any) -> Any:
        top = [e for e in base.manifest.files if "/" not in e.path]
        shown: Any = types.SimpleNamespace(
            path=base.path, step=base.step, manifest=types.SimpleNamespace(files=top)
        )
        return real(root, shown, *args, **kw)

    with patched(_amend, "carry_over", carry_over):
        yield


@contextlib.contextmanager
def _thread_join_error_ignored() -> Iterator[None]:
    """An error leaving a block joined from another thread than the commit's own is not
    counted: the commit publishes the half that thread wrote."""
    real_init, real_leave = Commit.__init__, _joining.JoinedBlocks.leave_join
    owners: dict[int, int] = {}

    def init(self: Commit, *args: Any, **kw: Any) -> None:
        real_init(self, *args, **kw)
        owners[id(self)] = threading.get_ident()

    def leave_join(self: Any, exc: BaseException | None) -> None:
        if exc is not None and owners.get(id(self)) != threading.get_ident():
            exc = None
        real_leave(self, exc)

    with (
        patched(Commit, "__init__", init),
        patched(_joining.JoinedBlocks, "leave_join", leave_join),
    ):
        yield


@contextlib.contextmanager
def _carry_ignores_inode() -> Iterator[None]:
    """A carry trusts a source whose size and modification time match its manifest entry,
    whatever its inode: a file replaced by another of the same size and time is carried
    with the old file's checksum."""

    def one(target: Path, source: Checkpoint, pin: int, entry: Any, made: dict[str, Any]) -> Any:
        method, st = _share.share_file(pin, entry.path, target)
        if (st.st_size, st.st_mtime_ns) != (entry.size, entry.mtime_ns):
            os.unlink(target)
            raise _carry._changed(source, entry, "it changed")
        bare = dataclasses.replace(entry, ino=None, mtime_ns=None)
        made[entry.path] = (bare, identity(os.lstat(target)))
        return method

    with patched(_carry, "_one", one):
        yield


@contextlib.contextmanager
def _dedup_size_only() -> Iterator[None]:
    """Dedup links a previous checkpoint's file of the same size, bytes unread."""

    def equal(mine: Any, their: Any) -> bool:
        return (
            their is not None
            and mine.type == "file"
            and mine.size > 0
            and mine.size == their.size
            and their.ino is not None
            and their.mtime_ns is not None
        )

    with patched(_dedup, "_equal", equal), patched(_dedup, "_same_bytes", lambda a, b: True):
        yield


@contextlib.contextmanager
def _set_best_unmarked() -> Iterator[None]:
    """``set_best`` points ``checkpoint_best`` at any directory of the step, complete or not."""

    def set_best(root: Any, step: int) -> Checkpoint:
        path = root.path / root.name_of(step)
        if not path.is_dir():
            raise CheckpointNotFoundError(f"no directory for step {step}", path=path, step=step)
        ckpt = Checkpoint(step, path, None)  # type: ignore[arg-type]
        with root.locked():
            _delete.set_best_locked(root, ckpt)
        return ckpt

    with patched(_delete, "set_best", set_best):
        yield


@contextlib.contextmanager
def _steps_descending() -> Iterator[None]:
    """``steps()`` lists the complete steps newest first."""

    def steps(self: CheckpointDir) -> list[int]:
        return sorted((c.step for c in self.checkpoints()), reverse=True)

    with patched(CheckpointDir, "steps", steps):
        yield


@contextlib.contextmanager
def _async_close_swallows() -> Iterator[None]:
    """``AsyncCommitter.close()`` waits for the save in flight but drops its error."""

    def close(self: AsyncCommitter) -> None:
        with self._lock:
            self._closed = True
            with contextlib.suppress(BaseException):
                self._join()

    with patched(AsyncCommitter, "close", close):
        yield


@contextlib.contextmanager
def _async_save_drops_error() -> Iterator[None]:
    """``AsyncCommitter.save`` waits for the previous save but drops its error, and starts
    the next one (``close()`` still raises an error it finds)."""
    real = AsyncCommitter.save

    def save(self: AsyncCommitter, *args: Any, **kw: Any) -> None:
        thread = self._thread
        if thread is not None:
            thread.join()
        self._error = None
        real(self, *args, **kw)

    with patched(AsyncCommitter, "save", save):
        yield


@contextlib.contextmanager
def _old_copy_left() -> Iterator[None]:
    """A replace leaves the older save (exchanged under the staging name) in the root
    instead of removing it: a leak ``clean()`` must find, beside the checkpoints."""

    def remove_tree(path: Path) -> None:
        if sys._getframe(1).f_code is Commit._protocol.__code__:
            return
        _fs.remove_tree(path)

    class _Fs(types.ModuleType):  # the syscall module, as the recorder has hooked it
        def __getattr__(self, name: str) -> Any:
            return remove_tree if name == "remove_tree" else getattr(_fs, name)

    with patched(_commit, "_fs", _Fs("fs")):
        yield


@contextlib.contextmanager
def _replace_aliases_always() -> Iterator[None]:
    """Every replacing commit drops the older save's aliases, as if ``replace_aliases``."""
    real_init = Commit.__init__

    def init(self: Commit, *args: Any, **kw: Any) -> None:
        real_init(self, *args, **kw)
        self.replace_aliases = True

    with patched(Commit, "__init__", init):
        yield


DEFECTS = {
    "retention_drops_latest": _retention_drops_latest,
    "prune_counts_unmarked": _prune_counts_unmarked,
    "clean_force_removes_live_staging": _clean_force_live,
    "amend_drops_nested_files": _amend_drops_nested,
    "thread_join_error_not_aborting": _thread_join_error_ignored,
    "carry_ignores_inode": _carry_ignores_inode,
    "dedup_compares_size_only": _dedup_size_only,
    "set_best_accepts_unmarked": _set_best_unmarked,
    "steps_descending": _steps_descending,
    "async_close_swallows_error": _async_close_swallows,
    # three more of the same kind (not from the attack)
    "async_save_drops_error": _async_save_drops_error,
    "replace_leaves_old_copy": _old_copy_left,
    "replace_aliases_always": _replace_aliases_always,
}
"""The attack round's defects (and three more), by name: each a context manager."""
