"""Defects invented to attack the model check (issue 31, item 6): plausible slips in the
ordering, durability and bookkeeping of the operations above the protocol, each a context
manager that patches the library for a with block;
:data:`~atomic_ckpt.testing.mutants.API_MUTANTS` names them."""

from __future__ import annotations

import contextlib
import copy
import os
import sys
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from atomic_ckpt import BEST_LINK, CheckpointNotFoundError, Commit, SyncPolicy
from atomic_ckpt._core.l1_names.names import new_token, parse_tmp
from atomic_ckpt._core.l2_syscalls import fs as _fs
from atomic_ckpt._core.l3_formats import verify as _verify
from atomic_ckpt._core.l4_protocol import amend as _amend
from atomic_ckpt._core.l4_protocol import begin as _begin
from atomic_ckpt._core.l4_protocol import delete as _delete
from atomic_ckpt._core.l4_protocol import named as _named
from atomic_ckpt._core.l4_protocol import onefile as _onefile
from atomic_ckpt._core.l4_protocol import repair as _repair
from atomic_ckpt._core.l4_protocol import stage as _stage
from atomic_ckpt.testing.defects import patched as _patched

__all__ = ["MORE_DEFECTS"]


class _Proxy(types.ModuleType):
    """A module as another module sees it, with some attributes replaced."""

    def __init__(self, real: types.ModuleType, **replaced: Any) -> None:
        super().__init__(real.__name__)
        self._real, self._replaced = real, replaced

    def __getattr__(self, name: str) -> Any:
        return self._replaced[name] if name in self._replaced else getattr(self._real, name)


@contextlib.contextmanager
def _root_fsync_before_rename() -> Iterator[None]:
    """A commit fsyncs the root just before its promoting rename instead of after it: the
    rename (the commit itself) is not durable when ``commit`` returns."""
    real_promote, real_root = _stage.promote, SyncPolicy.root
    skip = threading.local()

    def promote(root: Any, *args: Any) -> Any:
        real_root(root.sync, root.path)
        out = real_promote(root, *args)
        skip.next = True
        return out

    def sync_root(self: SyncPolicy, path: Path) -> None:
        if getattr(skip, "next", False):
            skip.next = False
            return
        real_root(self, path)

    with _patched(_stage, "promote", promote), _patched(SyncPolicy, "root", sync_root):
        yield


@contextlib.contextmanager
def _verify_ignores_missing() -> Iterator[None]:
    """``verify()`` passes a checkpoint whose manifest lists a file that is not there."""
    real = _verify._compare

    def compare(top: str, entry: Any, found: Any, algorithm: str | None) -> str | None:
        return None if found is None else real(top, entry, found, algorithm)

    with _patched(_verify, "_compare", compare):
        yield


@contextlib.contextmanager
def _retain_counts_named() -> Iterator[None]:
    """A retention counts the named checkpoints among the last ``keep_last`` it keeps (one
    named checkpoint: one step fewer is kept)."""
    real = _delete.retain

    def retain(root: Any, policy: Any) -> Any:
        n = len(_named.listing(root)) if root.path.is_dir() else 0
        if n and policy.keep_last is not None:
            policy = copy.copy(policy)
            object.__setattr__(policy, "keep_last", max(policy.keep_last - n, 0) or None)
            if policy.keep_last is None and policy.keep_every is None:
                object.__setattr__(policy, "keep_every", 10**9)  # keeps the latest only
        return real(root, policy)

    with _patched(_delete, "retain", retain):
        yield


@contextlib.contextmanager
def _remove_alias_not_durable() -> Iterator[None]:
    """``remove_alias`` unlinks the symlink but does not fsync the root: the removal is
    not durable when it returns."""

    def remove_alias(root: Any, alias: str) -> None:
        _delete.check_alias(root, alias)
        path = root.path / alias
        with root.locked():
            if not path.is_symlink():
                raise CheckpointNotFoundError(f"no alias {alias!r}", path=path)
            _fs.unlink(path)

    with _patched(_delete, "remove_alias", remove_alias):
        yield


@contextlib.contextmanager
def _drop_aliases_not_durable() -> Iterator[None]:
    """``replace_aliases`` unlinks the older save's aliases without fsyncing the root
    before the promotion: a power loss may keep the promotion and lose the unlinks."""

    def drop_aliases(root: Any, name: str, *, keep: list[str]) -> None:
        for alias in _delete.aliases_of(root, {name}):
            if alias.name not in keep:
                _fs.unlink(alias)

    with _patched(_delete, "drop_aliases", drop_aliases):
        yield


@contextlib.contextmanager
def _amend_drops_metadata() -> Iterator[None]:
    """An amend writes only its own metadata: the older save's keys are lost (the merge
    of the two is skipped)."""
    real_carry, real_rewrite = _amend.carry_over, _amend._rewrite_marker

    def amending() -> Any:  # the frame of amend() (its locals: the amend's own metadata)
        frame: Any = sys._getframe(2)
        while "extra" not in frame.f_locals:
            frame = frame.f_back
        return frame

    def carry_over(*args: Any, **kw: Any) -> Any:
        frame = amending()
        frame.f_locals["commit"].metadata = dict(frame.f_locals["extra"])
        return real_carry(*args, **kw)

    def rewrite_marker(root: Any, base: Any, metadata: dict[str, Any]) -> None:
        real_rewrite(root, base, dict(amending().f_locals["extra"]))

    with (
        _patched(_amend, "carry_over", carry_over),
        _patched(_amend, "_rewrite_marker", rewrite_marker),
    ):
        yield


@contextlib.contextmanager
def _clean_removes_live_staging() -> Iterator[None]:
    """Plain ``clean()`` (not forced) removes a staging dir whose writer is alive (its
    lock held by an open commit of this very process)."""
    real = _repair.orphans

    def orphans(root: Any, *, dry_run: bool, force: bool = False) -> Any:
        found = real(root, dry_run=dry_run, force=force)
        if dry_run or force:
            return found
        have = {p for p, _ in found}
        for name in sorted(os.listdir(root.path)):
            tmp = parse_tmp(name)
            if tmp is None or tmp.is_lock or tmp.tag != "" or root.path / name in have:
                continue
            if (root.path / name).is_dir() and not (root.path / name).is_symlink():
                found.append((root.path / name, None))
        return found

    with _patched(_repair, "orphans", orphans):
        yield


@contextlib.contextmanager
def _retention_before_publish() -> Iterator[None]:
    """A commit with ``retain=`` applies its retention before publishing: a crash between
    has deleted older checkpoints without the new one."""
    real = Commit.finish

    def finish(self: Commit, files: Any = None) -> Any:
        policy, self.retain = self.retain, None
        if policy is not None:
            _delete.retain(self._root, policy)
        return real(self, files)

    with _patched(Commit, "finish", finish):
        yield


@contextlib.contextmanager
def _promote_drops_metadata() -> Iterator[None]:
    """``promote_named`` commits the step without the named checkpoint's metadata."""

    def begin(root: Any, step: Any, **kw: Any) -> Any:
        kw["metadata"] = None
        return _begin.begin(root, step, **kw)

    with _patched(_named, "_begin", _Proxy(_begin, begin=begin)):
        yield


@contextlib.contextmanager
def _promote_drops_aliases() -> Iterator[None]:
    """``promote_named`` does not move the named checkpoint's aliases to the step: they
    go with the named checkpoint."""

    def begin(root: Any, step: Any, **kw: Any) -> Any:
        kw["aliases"] = []
        return _begin.begin(root, step, **kw)

    with _patched(_named, "_begin", _Proxy(_begin, begin=begin)):
        yield


@contextlib.contextmanager
def _set_best_not_durable() -> Iterator[None]:
    """``set_best`` renames the new pointer into place without fsyncing the root."""

    def set_best_locked(root: Any, ckpt: Any) -> None:
        tmp = root.path / root.tmp_name(BEST_LINK, new_token())
        _fs.symlink_replace(ckpt.path.name, root.path / BEST_LINK, tmp)

    with _patched(_delete, "set_best_locked", set_best_locked):
        yield


@contextlib.contextmanager
def _atomic_write_no_dir_fsync() -> Iterator[None]:
    """``atomic_write`` renames the file into place without fsyncing its directory."""
    with _patched(_onefile, "_fsync_directory", lambda directory, target, what: None):
        yield


MORE_DEFECTS = {
    "root_fsync_before_rename": _root_fsync_before_rename,
    "verify_ignores_missing_file": _verify_ignores_missing,
    "retain_counts_named": _retain_counts_named,
    "remove_alias_not_durable": _remove_alias_not_durable,
    "drop_aliases_not_durable": _drop_aliases_not_durable,
    "amend_drops_metadata": _amend_drops_metadata,
    "clean_removes_live_staging": _clean_removes_live_staging,
    "retention_before_publish": _retention_before_publish,
    "promote_drops_metadata": _promote_drops_metadata,
    "promote_drops_aliases": _promote_drops_aliases,
    "set_best_not_durable": _set_best_not_durable,
    "atomic_write_no_dir_fsync": _atomic_write_no_dir_fsync,
}
"""The invented defects, by name: each a context manager that puts one in."""
