"""Protocol mutants: the full durability protocol with one step switched off, which the
power-loss simulation must reject (they live here, never in the library itself); and
API mutants (:func:`api_mutant`): the defects reviews found in the operations above
the protocol, put back one at a time for the model check to find."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from atomic_ckpt import MARKER, Commit, SyncPolicy
from atomic_ckpt._core.l2_syscalls import fs as _fs
from atomic_ckpt._core.l2_syscalls import share as _share
from atomic_ckpt._core.l3_formats.tree import identity
from atomic_ckpt._core.l4_protocol import amend as _amend
from atomic_ckpt._core.l4_protocol import begin as _begin
from atomic_ckpt._core.l4_protocol import carry as _carry
from atomic_ckpt._core.l4_protocol import commit as _commit
from atomic_ckpt._core.l4_protocol import delete as _delete
from atomic_ckpt._core.l4_protocol import joining as _joining
from atomic_ckpt._core.l4_protocol import stage as _stage
from atomic_ckpt._core.l5_facade import closing as _closing
from atomic_ckpt.testing.defects import DEFECTS
from atomic_ckpt.testing.defects import patched as _patched
from atomic_ckpt.testing.later_defects import LATER_DEFECTS
from atomic_ckpt.testing.more_defects import MORE_DEFECTS

__all__ = ["API_MUTANTS", "KILLED_BY", "KILLED_UNDER", "STEPS", "api_mutant", "mutant"]

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


# ---- API mutants: each patches one module attribute for the duration of a with block


@contextlib.contextmanager
def _join_no_abort() -> Iterator[None]:
    """A joined block's error leaves the outer commit open: it publishes the half."""

    @contextlib.contextmanager
    def joined(commit: Commit, **options: Any) -> Iterator[Path]:
        _joining.merge_options(commit, **options)
        yield commit.path

    with _patched(_joining, "joined", joined):
        yield


@contextlib.contextmanager
def _amend_stale_entries() -> Iterator[None]:
    """amend carries the replaced files' old manifest entries over beside the new ones."""
    real = _amend.carry_over

    def carry_over(root: Any, base: Any, staging: Path, written: Any, gone: Any, **kw: Any) -> Any:
        out = real(root, base, staging, written, gone, **kw)
        new = {e.path for e in written}
        return out + [e for e in base.manifest.files if e.path in new and e.type == "file"]

    with _patched(_amend, "carry_over", carry_over):
        yield


@contextlib.contextmanager
def _aliases_after_root_fsync() -> Iterator[None]:
    """A commit points its aliases only after the root fsync: they are not durable when
    it returns."""
    real_point, real_protocol = _delete.point_aliases, Commit._protocol
    pending: list[tuple[Any, ...]] = []

    def point_aliases(*args: Any) -> None:
        pending.append(args)

    def protocol(self: Commit, *args: Any) -> Any:
        out = real_protocol(self, *args)
        for call in pending:
            real_point(*call)
        pending.clear()
        return out

    with _patched(_delete, "point_aliases", point_aliases), _patched(Commit, "_protocol", protocol):
        yield


@contextlib.contextmanager
def _drop_aliases_after_promotion() -> Iterator[None]:
    """replace_aliases drops the older save's aliases after the promotion, not before: a
    crash between leaves an old label on the new contents."""
    real_drop, real_promote = _delete.drop_aliases, _stage.promote
    pending: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def drop_aliases(*args: Any, **kw: Any) -> None:
        pending.append((args, kw))

    def promote(*args: Any) -> Any:
        out = real_promote(*args)
        for a, kw in pending:
            real_drop(*a, **kw)
        pending.clear()
        return out

    with _patched(_delete, "drop_aliases", drop_aliases), _patched(_stage, "promote", promote):
        yield


@contextlib.contextmanager
def _publish_not_waiting() -> Iterator[None]:
    """publish does not wait for blocks joined from other threads: it publishes without
    the part they are still writing."""

    def seal(self: Commit) -> None:
        self._require_open("publish")
        with self._cond:
            self._sealed = True

    with _patched(_joining.JoinedBlocks, "seal", seal):
        yield


@contextlib.contextmanager
def _join_options_dropped() -> Iterator[None]:
    """A joined block's metadata, aliases and retain are dropped, not merged."""

    @contextlib.contextmanager
    def joined(commit: Commit, **options: Any) -> Iterator[Path]:
        commit.enter_join()
        try:
            yield commit.path
        except BaseException as exc:
            commit.leave_join(exc)
            raise
        commit.leave_join(None)

    with _patched(_joining, "joined", joined):
        yield


@contextlib.contextmanager
def _rejoin_replaces() -> Iterator[None]:
    """join=True with no open commit over a committed checkpoint replaces all of it with
    the one part."""
    with _patched(_joining, "refuse_rejoin", lambda final, step: None):
        yield


@contextlib.contextmanager
def _own_alias_unchecked() -> Iterator[None]:
    """An alias equal to the checkpoint's own name is not refused up front: the commit
    publishes, then fails making the alias."""
    with contextlib.ExitStack() as stack:
        for module in (_begin, _commit, _joining):
            stack.enter_context(_patched(module, "check_own_aliases", lambda name, aliases: None))
        yield


@contextlib.contextmanager
def _carry_trusts_source() -> Iterator[None]:
    """A carry reuses the source's manifest entry without checking the file is still the
    one it describes (written in place since: the new checkpoint records a stale checksum)."""

    def one(target: Path, source: Any, pin: int, entry: Any, made: dict[str, Any]) -> Any:
        method, _ = _share.share_file(pin, entry.path, target)
        bare = dataclasses.replace(entry, ino=None, mtime_ns=None)
        made[entry.path] = (bare, identity(os.lstat(target)))
        return method

    with _patched(_carry, "_one", one):
        yield


API_MUTANTS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "join_error_not_aborting": _join_no_abort,
    "amend_stale_entries": _amend_stale_entries,
    "aliases_after_root_fsync": _aliases_after_root_fsync,
    "replace_aliases_drop_after_promotion": _drop_aliases_after_promotion,
    "publish_not_waiting_for_join": _publish_not_waiting,
    "join_options_dropped": _join_options_dropped,
    "rejoin_replaces_committed": _rejoin_replaces,
    "own_alias_after_publish": _own_alias_unchecked,
    "carry_trusts_changed_source": _carry_trusts_source,
    **DEFECTS,
    **MORE_DEFECTS,
    **LATER_DEFECTS,
}
"""The review defects, by name: each a context manager that puts one back (those of the
outside attack from :mod:`atomic_ckpt.testing.defects`, those invented to attack the
model check from :mod:`atomic_ckpt.testing.more_defects`, those later reviews found from
:mod:`atomic_ckpt.testing.later_defects`)."""


@contextlib.contextmanager
def api_mutant(name: str) -> Iterator[None]:
    """Put the review defect ``name`` (one of :data:`API_MUTANTS`) back for a with block
    (in this process only: it patches the library's module attributes). A background
    failure the defect left unobserved is forgotten at the end of the block: the exit
    hook would otherwise end the process with status 1, every check passed."""
    if name not in API_MUTANTS:
        raise ValueError(f"unknown API mutant {name!r}; choose one of {sorted(API_MUTANTS)}")
    with _closing._UNOBSERVED_LOCK:
        before = set(_closing._UNOBSERVED)
    try:
        with API_MUTANTS[name]():
            yield
    finally:
        with _closing._UNOBSERVED_LOCK:
            for key in set(_closing._UNOBSERVED) - before:
                del _closing._UNOBSERVED[key]


KILLED_BY: dict[str, tuple[str, tuple[str, ...]]] = {
    "join_error_not_aborting": ("empty", ("join_raises",)),
    "amend_stale_entries": ("two", ("amend_files",)),
    "aliases_after_root_fsync": ("two", ("commit_alias",)),
    "replace_aliases_drop_after_promotion": ("two", ("commit_replace_aliases",)),
    "publish_not_waiting_for_join": ("empty", ("join_thread",)),
    "join_options_dropped": ("empty", ("join_options",)),
    "rejoin_replaces_committed": ("two", ("join_alone",)),
    "own_alias_after_publish": ("empty", ("named_own_alias",)),
    "carry_trusts_changed_source": ("two", ("carry_changed",)),
    "retention_drops_latest": ("prefixed", ("retain_every",)),
    "prune_counts_unmarked": ("mixed", ("prune",)),
    "clean_force_removes_live_staging": ("empty", ("clean_force_in_commit",)),
    "amend_drops_nested_files": ("two", ("amend_nested",)),
    "thread_join_error_not_aborting": ("empty", ("join_thread_raises",)),
    "carry_ignores_inode": ("two", ("carry_replaced",)),
    "dedup_compares_size_only": ("two", ("commit_dedup",)),
    "set_best_accepts_unmarked": ("mixed", ("set_best",)),
    "steps_descending": ("two", ("set_best",)),
    "async_close_swallows_error": ("empty", ("async_save_raises",)),
    "async_save_drops_error": ("empty", ("async_save_after_failure",)),
    "replace_leaves_old_copy": ("two", ("commit_replace",)),
    "replace_aliases_always": ("two", ("commit_keep_aliases",)),
    "root_fsync_before_rename": ("empty", ("commit_new",)),
    "verify_ignores_missing_file": ("two", ("verify_damaged",)),
    "retain_counts_named": ("prefixed", ("commit_retain_two",)),
    "remove_alias_not_durable": ("two", ("remove_alias",)),
    "drop_aliases_not_durable": ("two", ("commit_replace_aliases",)),
    "amend_drops_metadata": ("two", ("amend_files",)),
    "clean_removes_live_staging": ("empty", ("clean_in_commit",)),
    "retention_before_publish": ("two", ("commit_retain",)),
    "promote_drops_metadata": ("prefixed", ("promote_named",)),
    "promote_drops_aliases": ("prefixed", ("promote_named",)),
    "set_best_not_durable": ("two", ("set_best",)),
    "atomic_write_no_dir_fsync": ("empty", ("atomic_write",)),
    "carry_in_flight_not_waited": ("two", ("carry_thread",)),
    "open_join_in_own_thread_ignored": ("empty", ("join_generator",)),
    "open_join_blames_publish": ("empty", ("join_generator",)),
    "nested_commit_not_refused": ("empty", ("commit_nested",)),
    "late_join_commits_alone": ("empty", ("late_join",)),
    "delete_unlinks_not_durable": ("two", ("delete_best_force",)),
    "interrupted_publish_left_open": ("empty", ("publish_interrupted",)),
    "distributed_nested_not_refused": ("empty", ("distributed_nested",)),
    "rank0_one_block_per_step": ("empty", ("rank0_threads",)),
}
"""For each API mutant, a sequence of the default model check (a starting root of
:data:`~atomic_ckpt.testing.alphabet.ROOTS`, action names) that fails with it put back."""

KILLED_UNDER: dict[str, tuple[str, ...]] = {
    "drop_aliases_not_durable": ("subset",),
    "delete_unlinks_not_durable": ("subset",),
}
"""The crash models a mutant's :data:`KILLED_BY` sequence is checked under, where not the
default ``kill`` and ``power``: a missing fsync between two changes of the root that only
a filesystem keeping them out of order shows (the default run crashes every single action
under ``subset`` too, tests/testing/test_model_reordered.py)."""
