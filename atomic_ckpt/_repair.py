"""Repair and removal in a root: ``clean()``, the fallback-window restore, durable
deletes, retention and the ``checkpoint_best`` pointer.

Everything that decides *and* acts on what other processes may be changing
(which copy to restore, which checkpoints a policy deletes, where the best
pointer goes) does both under the root lock; only the slow removal of trees
already moved out of sight runs outside it.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from . import _fs, _locks
from ._errors import CheckpointNotFoundError, ManifestError
from ._names import (
    BEST_LINK,
    LOCK_SUFFIX,
    TAG_DELETE,
    TAG_OLD,
    TMP_INFIX,
    lock_name,
    new_token,
    parse_step,
    parse_tmp,
    tmp_name,
)
from ._read import Checkpoint, classify, complete, read_marker
from ._retention import RetentionPolicy
from ._root import Root

log = logging.getLogger(__name__)

Moved = list[tuple[Path, Path, _locks.Lock]]
"""Checkpoints moved out of sight: (original path, aside path, the token lock held)."""


# --------------------------------------------------------------------------- the fallback window


def is_restorable(root: Root, path: Path) -> bool:
    """Is ``path`` the old copy of a fallback replace that crashed in its window?

    That is: a complete ``N.tmp-old-<t>`` copy, no ``N``, no live writer, and the
    same writer's staging dir ``N.tmp-<t>`` still there. Once the staging dir has
    been renamed to ``N`` its old copy is garbage, even if ``N`` is later pruned:
    it must never come back. Whatever the root's prefix: the name is the library's.
    """
    tmp = parse_tmp(path.name)
    if tmp is None or tmp.tag != TAG_OLD or tmp.is_lock:
        return False
    base = root.path
    if (
        os.path.lexists(base / tmp.name)
        or not (base / tmp_name(tmp.name, tmp.token)).is_dir()
        or _locks.is_held(base / lock_name(tmp.name, tmp.token))
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
    old_tag = TMP_INFIX + TAG_OLD
    # Runs at every commit: filter on the name before touching the disk.
    for name in sorted(n for n in os.listdir(root.path) if old_tag in n):
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
    the name of the best pointer's temporary link. A foreign ``x.tmp-<hex>``
    entry has none of these.
    """
    lock = next((p for p in tokens[token] if p.name.endswith(LOCK_SUFFIX)), None)
    if lock is not None:
        try:
            if stat.S_ISREG(os.lstat(lock).st_mode):
                return True
        except FileNotFoundError:
            pass
    tmp = parse_tmp(path.name)
    if tmp is not None and tmp.name == BEST_LINK and path.is_symlink():
        return True
    try:
        manifest = read_marker(path) if path.is_dir() and not path.is_symlink() else None
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


def orphans(root: Root, *, dry_run: bool) -> list[tuple[Path, _locks.Lock | None]]:
    """Entries left by dead writers, each with its claimed token lock (call under the root
    lock unless ``dry_run``). Restores the fallback's interrupted replaces first."""
    restore_asides(root, dry_run=dry_run)
    groups = _tokens(root)
    found: list[tuple[Path, _locks.Lock | None]] = []
    for token, paths in groups.items():
        ours = [p for p in paths if _is_ours(root, groups, token, p)]
        if not ours:
            if paths:
                log.info("leaving %s alone: atomic_ckpt did not make it", paths[0])
            continue
        tmp = parse_tmp(ours[0].name)
        assert tmp is not None
        lock_path = root.path / lock_name(tmp.name, token)
        if dry_run:
            if not _locks.is_held(lock_path):
                found += [(p, None) for p in ours if not is_restorable(root, p)]
            continue
        lock = _locks.try_acquire(lock_path)
        if lock is None:
            continue  # a live writer holds it
        found += [(p, lock) for p in ours]
        if lock_path in paths and lock_path not in ours:
            found.append((lock_path, lock))
    return found


def clean(root: Root, *, dry_run: bool) -> list[Path]:
    """Remove what crashed or killed saves left behind; see ``CheckpointDir.clean``."""
    if not root.path.is_dir():
        return []
    if dry_run:
        # Only reads: takes no lock of its own, so it works on a read-only root
        # (and may list a save that finishes meanwhile).
        return [path for path, _ in orphans(root, dry_run=True)]
    # Claim the orphans (their token locks) under the root lock, then delete them
    # outside it, so a slow deletion never stalls a commit's promotion.
    with root.locked():
        claimed = orphans(root, dry_run=False)
    removed: list[Path] = []
    locks = {id(lock): lock for _, lock in claimed if lock is not None}
    try:
        for path, lock in claimed:
            if lock is None or lock.path != path:
                _fs.remove_tree(path)
            removed.append(path)
    finally:
        for lock in locks.values():
            lock.release(remove=True)
    return removed


# --------------------------------------------------------------------------- deleting


def move_aside(root: Root, paths: list[Path]) -> Moved:
    """Move checkpoint directories out of sight, durably (call under the root lock).

    Each gets a token lock and a ``N.tmp-del-<t>`` name; the root is fsynced
    once. A path that is already gone is skipped.
    """
    moved: Moved = []
    try:
        for path in paths:
            lock = None
            while lock is None:
                token = new_token()
                lock = _locks.create(root.path / lock_name(path.name, token))
            aside = root.path / tmp_name(path.name, token, TAG_DELETE)
            try:
                _fs.rename(path, aside)
            except FileNotFoundError:
                lock.release(remove=True)
                continue
            except BaseException:
                lock.release(remove=True)  # nothing was moved: leave no lock file behind
                raise
            moved.append((path, aside, lock))
        if moved:
            root.sync.root(root.path)
    except BaseException:
        # What was moved is out of sight, intact (its marker tells clean() it is ours).
        for _, aside, lock in moved:
            release_leaving(lock, aside)
        raise
    return moved


def release_leaving(lock: _locks.Lock, leftover: Path) -> None:
    """Release a token's lock, leaving ``leftover`` behind for ``clean()``.

    The lock file is removed only if ``leftover`` is gone or still holds our
    manifest: otherwise (a removal that failed after the marker went) the lock
    file is the only evidence that lets ``clean()`` remove it.
    """
    try:
        manifest = read_marker(leftover) if os.path.lexists(leftover) else None
        keep = os.path.lexists(leftover) and (manifest is None or manifest.legacy)
    except (ManifestError, OSError):
        keep = True
    lock.release(remove=not keep)


def remove_moved(moved: Moved) -> list[Path]:
    """Remove what :func:`move_aside` moved (outside the root lock); the original paths."""
    try:
        for _, aside, _ in moved:
            _fs.remove_tree(aside)
    except BaseException:
        for _, aside, lock in moved:
            release_leaving(lock, aside)  # clean() finishes the removal
        raise
    for _, _, lock in moved:
        lock.release(remove=True)
    return [path for path, _, _ in moved]


# --------------------------------------------------------------------------- the best pointer


def best_step(root: Root) -> int | None:
    """The step ``checkpoint_best`` names, or None (no link, or not a step name)."""
    try:
        target = os.readlink(root.path / BEST_LINK)
    except OSError:  # missing, not a symlink, or a name too long
        return None
    # A checkpoint root is untrusted input: only a plain sibling name counts.
    if "/" in target or os.sep in target:
        return None
    return parse_step(target, root.prefix)


def read_best(root: Root) -> Checkpoint | None:
    """The complete checkpoint ``checkpoint_best`` names, or None."""
    step = best_step(root)
    if step is None:
        return None
    path = root.path / root.name_of(step) if _fits(root, step) else None
    entry = classify(path, step) if path is not None and path.is_dir() else None
    if entry is None or entry.manifest is None or path is None or path.is_symlink():
        log.warning("%s names no complete checkpoint", root.path / BEST_LINK)
        return None
    return Checkpoint(step, path, entry.manifest)


def _fits(root: Root, step: int) -> bool:
    try:
        root.name_of(step)
    except ValueError:
        return False
    return True


def set_best_locked(root: Root, ckpt: Checkpoint) -> None:
    """Point ``checkpoint_best`` at ``ckpt`` atomically and durably (under the root lock).

    A new symlink under a ``.tmp-`` name (which ``clean()`` removes if we crash)
    is renamed over the old one, then the root is fsynced.
    """
    tmp = root.path / tmp_name(BEST_LINK, new_token())
    _fs.symlink_replace(ckpt.path.name, root.path / BEST_LINK, tmp)
    root.sync.root(root.path)


def require_complete(root: Root, step: int) -> Checkpoint:
    """The complete checkpoint of ``step`` (read under the caller's lock)."""
    path = root.path / root.name_of(step)
    entry = classify(path, step) if path.is_dir() and not path.is_symlink() else None
    if entry is None or entry.manifest is None:
        raise CheckpointNotFoundError(
            f"no complete checkpoint for step {step} in {root.path}", path=path, step=step
        )
    return Checkpoint(step, path, entry.manifest)


# --------------------------------------------------------------------------- retention


def retain(root: Root, policy: RetentionPolicy) -> list[Path]:
    """Apply ``policy``: move the best pointer (durably), then delete what it does not keep.

    The plan is made and carried out under the root lock, so a concurrent
    ``retain()`` cannot point ``checkpoint_best`` at a checkpoint this one is
    deleting; only the removal of what was moved aside runs after it.
    """
    if not root.path.is_dir():
        return []
    with root.locked():
        found = complete(root.path, root.prefix, root.warned)
        current = best_step(root)
        plan = policy.plan(found, protect=current)
        if plan.best is not None and plan.best.step != current:
            set_best_locked(root, plan.best)
            # The old target is protected no longer; plan again without it.
            plan = policy.plan(found, protect=plan.best.step)
        moved = move_aside(root, [c.path for c in plan.delete])
    return remove_moved(moved)
