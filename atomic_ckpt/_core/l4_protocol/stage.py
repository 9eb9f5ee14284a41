"""Steps 1 and 5 of the protocol, as building blocks: a fresh token lock and staging
directory; the target check; promotion (rename, exchange, or the move-aside fallback)."""

from __future__ import annotations

import errno
import logging
import os
import stat
from pathlib import Path

from atomic_ckpt._core.l1_names.errors import (
    CheckpointTimeoutError,
    ManifestError,
    MarkerIsDirectoryError,
    StepConflictError,
)
from atomic_ckpt._core.l1_names.names import MARKER, TAG_OLD, new_token, parse_tmp
from atomic_ckpt._core.l2_syscalls import fs as _fs
from atomic_ckpt._core.l2_syscalls import locks as _locks
from atomic_ckpt._core.l3_formats.manifest import Manifest
from atomic_ckpt._core.l3_formats.read import read_marker
from atomic_ckpt._core.l4_protocol.root import Root

log = logging.getLogger(__name__)

_TRIES = 100
"""Attempts at a fresh lock name before giving up (each attempt loses only to a remover)."""


def check_marker_free(staging: Path) -> None:
    """Refuse a save that wrote a directory under the marker's name: the marker's rename
    would fail on it with a bare EISDIR, and a file there is only a legacy marker."""
    if os.path.isdir(staging / MARKER) and not os.path.islink(staging / MARKER):
        raise MarkerIsDirectoryError(
            f"the save wrote a directory named {MARKER} in {staging}: that name is reserved "
            "for atomic_ckpt's marker file. Nothing was committed; give the directory "
            "another name in the save",
            path=staging / MARKER,
        )


def new_lock(root: Root, name: str) -> tuple[str, _locks.Lock]:
    """A fresh token for the entry ``name`` and its lock, held.

    A cleaner that claims the lock file in the instant before we lock it deletes it;
    :func:`_locks.create` notices and we take another token.
    """
    for _ in range(_TRIES):
        token = new_token()
        try:
            lock = _locks.create(root.path / root.lock_name(name, token))
        except OSError as exc:
            raise root.wrap(exc) from exc
        if lock is not None:
            return token, lock
    raise CheckpointTimeoutError(
        f"could not create a lock in {root.path} in {_TRIES} tries: another process keeps "
        "removing lock files there (is a foreign tool cleaning the root?)",
        path=root.path,
    )


def make_staging(root: Root, name: str) -> tuple[Path, _locks.Lock]:
    """Step 1: the staging lock, then the staging dir (``name.tmp-<token>``, or
    ``.tmp-name.<token>`` in a root with a prefix; its mode follows the umask, like any
    mkdir)."""
    token, lock = new_lock(root, name)
    staging = root.path / root.tmp_name(name, token)
    try:
        _fs.mkdir(staging)
    except BaseException as exc:
        lock.release(remove=True)
        if isinstance(exc, OSError):
            raise root.wrap(exc) from exc
        raise
    return staging, lock


def read_marker_or_none(path: Path) -> Manifest | None:
    """``path``'s manifest (its header only: the file list stays unread), or None if it
    has none or an unreadable one."""
    try:
        return read_marker(path, body=False)
    except (ManifestError, OSError):
        return None


def check_target(final: Path, step: int | None) -> None:
    """Refuse a step whose name is taken by something that is not a directory."""
    try:
        st = os.lstat(final)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a directory"
        raise StepConflictError(
            f"{final} exists and is {kind}, so a checkpoint cannot be committed there; "
            "move it away first",
            path=final,
            step=step,
        )


def promote(root: Root, staging: Path, final: Path) -> Path | None:
    """Step 5: move ``staging`` to ``final``; return where the old copy went, if any."""
    try:
        _fs.rename_noreplace(staging, final)
        return None
    except FileExistsError:
        pass
    except OSError as exc:
        if exc.errno != errno.ENOTEMPTY:
            raise
    try:
        _fs.rename_exchange(staging, final)
        return staging
    except OSError as exc:
        if exc.errno not in _fs.EXCHANGE_UNSUPPORTED:
            raise
        log.info("RENAME_EXCHANGE unsupported here (%s); replacing by moving aside", exc)
    # The fallback: move the old copy aside under a .tmp-old- name, then promote.
    # Between the two renames there is no N/; a crash there leaves the aside copy
    # *and* this staging dir, which is how clean() knows to rename the old copy back
    # (see _repair.is_restorable).
    tmp = parse_tmp(staging.name)
    assert tmp is not None
    aside = root.path / tmp.sibling(TAG_OLD)
    # The staging dir's entry must be durable before the old copy moves: without it,
    # a power loss could keep the move and lose the staging dir, and the old copy
    # would not be recognized as restorable.
    root.sync.root(root.path)
    _fs.replace_by_moving_aside(staging, final, aside, repair="clean() renames it back")
    return aside
