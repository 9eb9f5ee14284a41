"""Repair and removal in a root: ``clean()``, the fallback-window restore, durable
deletes, retention and the ``checkpoint_best`` pointer.

Everything that decides *and* acts on what other processes may be changing
(which copy to restore, which checkpoints a policy deletes, where the best
pointer goes) does both under the root lock; only the slow removal of trees
already moved out of sight runs outside it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from pathlib import Path

from atomic_ckpt._core.l1_names.errors import ManifestError
from atomic_ckpt._core.l1_names.names import (
    BEST_LINK,
    LOCK_SUFFIX,
    MARKER_TMP_PREFIX,
    TAG_OLD,
    TMP_INFIX,
    parse_tmp,
)
from atomic_ckpt._core.l2_syscalls import fs as _fs
from atomic_ckpt._core.l2_syscalls import locks as _locks
from atomic_ckpt._core.l3_formats.read import read_marker
from atomic_ckpt._core.l4_protocol import delete as _delete
from atomic_ckpt._core.l4_protocol.root import Root

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- the fallback window


def is_restorable(root: Root, path: Path) -> bool:
    """Is ``path`` the old copy of a fallback replace that crashed in its window?

    That is: a complete ``N.tmp-old-<t>`` copy (``.tmp-N.old-<t>``: the hidden form),
    no ``N``, no live writer, and the same writer's staging dir ``N.tmp-<t>`` (in the
    same form) still there. Once the staging dir has
    been renamed to ``N`` its old copy is garbage, even if ``N`` is later pruned:
    it must never come back. Whatever the root's prefix: the name is the library's.
    """
    tmp = parse_tmp(path.name)
    if tmp is None or tmp.tag != TAG_OLD or tmp.is_lock:
        return False
    base = root.path
    if (
        os.path.lexists(base / tmp.name)
        or not os.path.isdir(base / tmp.sibling())
        or _locks.is_held(base / tmp.lock())
    ):
        return False
    try:
        return read_marker(path) is not None
    except (ManifestError, OSError):
        return False


def restore_asides(root: Root, *, dry_run: bool = False) -> None:
    """Undo the crash window of the fallback replace (call under the root lock).

    The fallback moves ``N`` aside to ``N.tmp-old-…`` before renaming the new
    copy to ``N``; a crash between the two leaves no ``N``. A live writer is
    never in that window outside the root lock, so here every such copy is a
    crashed one: rename it back.
    """
    restored = False
    # Runs at every commit: filter on the name before touching the disk (``.tmp-old-``:
    # the plain form; ``.old-``: the hidden form).
    for name in sorted(n for n in os.listdir(root.path) if TMP_INFIX in n and TAG_OLD in n):
        path = root.path / name
        if is_restorable(root, path):
            tmp = parse_tmp(name)
            assert tmp is not None
            log.warning(
                "%s %s to %s (a replace was interrupted)",
                "would restore" if dry_run else "restoring",
                path,
                tmp.name,
            )
            if not dry_run:
                _fs.rename_noreplace(path, root.path / tmp.name)
                restored = True
    if restored:
        root.sync.root(root.path)


# --------------------------------------------------------------------------- clean


def _is_ours(root: Root, tokens: dict[str, list[Path]], token: str, path: Path) -> bool:
    """Did this library make ``path``? Only then may ``clean()`` remove it.

    The evidence: its token's lock file (every writer and deleter creates one
    first, and leaves it behind when it dies), a manifest of ours inside it, or
    the name of the best pointer's or an alias's temporary link (or of the best
    pointer's temporary file, a small one, where symlinks are refused). A foreign
    ``x.tmp-<hex>`` entry has none of these.
    """
    lock = next((p for p in tokens[token] if p.name.endswith(LOCK_SUFFIX)), None)
    try:
        if lock is not None and stat.S_ISREG(os.lstat(lock).st_mode):
            return True
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            tmp = parse_tmp(path.name)
            return tmp is not None and not tmp.is_lock and tmp.tag == ""
        if stat.S_ISREG(st.st_mode) and st.st_size <= _delete.POINTER_MAX:
            # The best pointer's file form (a root without symlinks), killed before its
            # rename.
            tmp = parse_tmp(path.name)
            return tmp is not None and not tmp.is_lock and tmp.tag == "" and tmp.name == BEST_LINK
        manifest = read_marker(path) if stat.S_ISDIR(st.st_mode) else None
    except (ManifestError, OSError):
        return False
    return manifest is not None and not manifest.legacy


def _tokens(root: Root) -> dict[str, list[Path]]:
    groups: dict[str, list[Path]] = {}
    for name in sorted(os.listdir(root.path)):
        tmp = parse_tmp(name)
        if tmp is not None:
            groups.setdefault(tmp.token, []).append(root.path / name)
    return groups


def orphans(
    root: Root, *, dry_run: bool, force: bool = False
) -> list[tuple[Path, _locks.Lock | None]]:
    """Entries left by dead writers, each with its claimed token lock (call under the root
    lock unless ``dry_run``). Restores the fallback's interrupted replaces first.
    ``force``: also entries of the library's form without evidence that it made them."""
    restore_asides(root, dry_run=dry_run)
    groups = _tokens(root)
    found: list[tuple[Path, _locks.Lock | None]] = []
    for token, paths in groups.items():
        ours = paths if force else [p for p in paths if _is_ours(root, groups, token, p)]
        if not ours:
            log.info("leaving %s alone: nothing shows that atomic_ckpt made it", paths[0])
            continue
        tmp = parse_tmp(ours[0].name)
        assert tmp is not None
        lock_path = root.path / tmp.lock()
        if dry_run:
            if not _locks.is_held(lock_path):
                found += [(p, None) for p in ours if not is_restorable(root, p)]
            continue
        try:
            lock = _locks.try_acquire(lock_path)
        except OSError as exc:  # a directory or a symlink at the lock's name: not ours
            log.warning(
                "leaving %s alone: its lock %s cannot be taken (%s)", ours[0], lock_path, exc
            )
            continue
        if lock is None:
            continue  # a live writer holds it
        found += [(p, lock) for p in ours if p != lock_path]
        if lock_path in paths:
            found.append((lock_path, lock))
    return found


def clean(root: Root, *, dry_run: bool, force: bool = False) -> list[Path]:
    """Remove what crashed or killed saves left behind; see ``CheckpointDir.clean``."""
    if not os.path.isdir(root.path):
        return []
    if dry_run:
        # Only reads: takes no lock of its own, so it works on a read-only root
        # (and may list a save that finishes meanwhile).
        return [path for path, _ in orphans(root, dry_run=True, force=force)] + marker_temps(root)
    # Claim the orphans (their token locks) under the root lock, then delete them
    # outside it, so a slow deletion never stalls a commit's promotion. The root is
    # fsynced first: an orphan may be the old copy of an exchange whose writer died
    # before its own root fsync, and removing that copy before the exchange is
    # durable could lose both versions in a power loss.
    with root.locked():
        claimed = orphans(root, dry_run=False, force=force)
        stale = marker_temps(root)
        for path in stale:  # a marker rewrite (adopt, amend, promote) killed midway
            with contextlib.suppress(FileNotFoundError):
                _fs.unlink(path)
        if claimed:
            try:
                root.sync.root(root.path)
            except BaseException:
                _release_all(claimed, remove=False)
                raise
    removed: list[Path] = []
    try:
        for path, lock in claimed:
            if lock is None or lock.path != path:
                _fs.remove_tree(path)
            removed.append(path)
        # The removals durable before the lock files (their evidence) go.
        root.sync.root(root.path)
    except BaseException:
        for path, lock in claimed:
            if lock is not None and lock.path != path and path not in removed:
                _delete.release_one(lock, leaving=path)
        _release_all(claimed, remove=False)
        raise
    _release_all(claimed, remove=True)
    return removed + stale


def marker_temps(root: Root) -> list[Path]:
    """Marker temporaries left inside checkpoints by a marker rewrite that died midway.

    Every rewrite (``mark_complete``, a metadata-only ``amend``, ``promote_named``)
    writes its temporary under the root lock, so one found under the lock is dead.
    """
    found: list[Path] = []
    with os.scandir(root.path) as it:
        dirs = [
            de.path for de in it if TMP_INFIX not in de.name and de.is_dir(follow_symlinks=False)
        ]
    for directory in dirs:
        try:
            with os.scandir(directory) as it:
                found += [Path(de.path) for de in it if de.name.startswith(MARKER_TMP_PREFIX)]
        except OSError:
            continue
    return sorted(found)


def _release_all(claimed: list[tuple[Path, _locks.Lock | None]], *, remove: bool) -> None:
    """Release every distinct lock of ``claimed``; a failure is logged, never stops the loop."""
    for lock in {id(lock): lock for _, lock in claimed if lock is not None}.values():
        _delete.release_one(lock, remove=remove)


def in_fallback_window(root: Root, staging: Path) -> bool:
    """Did a fallback replace fail to move its old copy back? Then ``staging`` (a failed
    commit's staging dir) is what tells clean() that the old copy must be restored: it
    stays."""
    tmp = parse_tmp(staging.name)
    assert tmp is not None
    aside = root.path / tmp.sibling(TAG_OLD)
    return os.path.isdir(aside) and not os.path.lexists(root.path / tmp.name)
