"""Durable deletes, and the pointers that must never dangle: aliases and ``checkpoint_best``.

A checkpoint is deleted by moving it out of sight (``N.tmp-del-<t>``, or
``.tmp-<prefix>N.del-<t>`` with a prefix; the
rename made durable under the root lock), then removing it, the marker first,
outside the lock. The aliases naming it go before it moves; the best pointer
moves (durably) before anything it protected is deleted. Retention plans are
made and carried out under the root lock, so two racing ``retain()`` calls
cannot point ``checkpoint_best`` at a checkpoint the other is deleting.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
from pathlib import Path

from atomic_ckpt._core.l1_names.errors import (
    CheckpointNotFoundError,
    ManifestError,
    StepConflictError,
    SymlinksUnsupportedError,
)
from atomic_ckpt._core.l1_names.names import (
    BEST_LINK,
    TAG_DELETE,
    TMP_INFIX,
    check_chosen_name,
    new_token,
    parse_step,
)
from atomic_ckpt._core.l2_syscalls import fs as _fs
from atomic_ckpt._core.l2_syscalls import locks as _locks
from atomic_ckpt._core.l2_syscalls.errnos import SYMLINK_REFUSED
from atomic_ckpt._core.l3_formats.read import Checkpoint, classify, complete, read_marker
from atomic_ckpt._core.l4_protocol import in_place as _in_place
from atomic_ckpt._core.l4_protocol import stage as _stage
from atomic_ckpt._core.l4_protocol.retention import RetentionPolicy
from atomic_ckpt._core.l4_protocol.root import Root

log = logging.getLogger(__name__)

Moved = list[tuple[Path, Path, _locks.Lock]]
"""Checkpoints moved out of sight: (original path, aside path, the token lock held)."""


def release_one(lock: _locks.Lock, *, remove: bool = False, leaving: Path | None = None) -> None:
    try:
        if leaving is not None:
            release_leaving(lock, leaving)
        else:
            lock.release(remove=remove)
    except OSError as exc:
        log.warning("could not release %s: %s", lock.path, exc)


# --------------------------------------------------------------------------- deleting


def move_aside(root: Root, paths: list[Path], *, unlinked: bool = False) -> Moved:
    """Move checkpoint directories out of sight, durably (call under the root lock).

    Each gets a token lock and a ``N.tmp-del-<t>`` name (in the root's form); the aliases naming it
    go; the root is fsynced once. A path that is already gone is skipped. ``unlinked``:
    the caller removed a link naming one of ``paths`` (the best pointer) just before.
    """
    moved: Moved = []
    if not paths:
        return moved  # nothing to move: not even a listing of the root
    # The links naming them go first, durably: a crash after this leaves them missing,
    # never dangling (without the fsync, a filesystem that does not keep the order of
    # a directory's changes could keep the renames below and lose the unlinks).
    if remove_aliases(root, {path.name for path in paths}) or unlinked:
        root.sync.root(root.path)
    try:
        for path in paths:
            token, lock = _stage.new_lock(root, path.name)
            aside = root.path / root.tmp_name(path.name, token, TAG_DELETE)
            try:
                _fs.rename(path, aside)
            except BaseException as exc:
                if _in_place.refused_rename(exc):  # an overlay's lower layer: no rename
                    moved.append((path, path, lock))  # removed here: remove_moved's no-op
                    _in_place.remove(root, path)
                    continue
                # Nothing was moved: leave no lock file behind.
                release_one(lock, remove=True)
                if isinstance(exc, FileNotFoundError):
                    continue
                raise
            moved.append((path, aside, lock))
        if moved:
            root.sync.root(root.path)
    except BaseException:
        # What was moved is out of sight, intact (its marker tells clean() it is ours).
        for _, aside, lock in moved:
            release_one(lock, leaving=aside)
        raise
    return moved


def release_leaving(lock: _locks.Lock, leftover: Path) -> None:
    """Release a token's lock, leaving ``leftover`` behind for ``clean()``.

    The lock file is removed only if ``leftover`` is gone or still holds our
    manifest: otherwise (a removal that failed after the marker went) the lock
    file is the only evidence that lets ``clean()`` remove it.
    """
    try:
        present = os.path.lexists(leftover)
        manifest = read_marker(leftover) if present else None
        keep = present and (manifest is None or manifest.legacy)
    except (ManifestError, OSError):
        keep = True
    lock.release(remove=not keep)


def remove_moved(root: Root, moved: Moved) -> list[Path]:
    """Remove what :func:`move_aside` moved (outside the root lock); the original paths."""
    try:
        for _, aside, _ in moved:
            _fs.remove_tree(aside)
        if moved:  # the removals durable before their evidence (the lock files) goes
            root.sync.root(root.path)
    except BaseException:
        for _, aside, lock in moved:
            release_one(lock, leaving=aside)  # clean() finishes the removal
        raise
    for _, _, lock in moved:
        release_one(lock, remove=True)
    return [path for path, _, _ in moved]


# --------------------------------------------------------------------------- aliases


def check_alias(root: Root, alias: str) -> str:
    """``alias`` if it can name a checkpoint in the root; ValueError otherwise (see
    :func:`~atomic_ckpt._core.l1_names.names.check_chosen_name`)."""
    return check_chosen_name("alias", alias, root.prefix, hidden=True)


def check_aliases_free(root: Root, aliases: list[str]) -> None:
    """StepConflictError if an alias's name is taken by something that is not a symlink."""
    for alias in aliases:
        where = root.path / alias
        if os.path.lexists(where) and not os.path.islink(where):
            raise StepConflictError(
                f"{where} exists and is not a symlink: it cannot become an alias", path=where
            )


def point_aliases(root: Root, aliases: list[str], target: str) -> None:
    """Point each alias (a symlink in the root) at the sibling ``target``, atomically
    (under the root lock; the caller fsyncs the root, which it has done for ``target``
    itself first: a refusal here says that checkpoint is committed)."""
    check_aliases_free(root, aliases)
    for alias in aliases:
        try:
            _fs.symlink_replace(
                target, root.path / alias, root.path / root.tmp_name(alias, new_token())
            )
        except OSError as exc:
            if not symlinks_refused(exc, root.path):
                raise
            raise no_symlinks_error(
                exc, root, f"checkpoint {root.path / target} is committed, but its alias"
            ) from exc


def symlinks_refused(exc: OSError, directory: Path) -> bool:
    """Whether ``exc``, from ``symlink()`` in ``directory``, says its filesystem makes no
    symlinks, rather than that the directory cannot be written at all."""
    return exc.errno in SYMLINK_REFUSED and os.access(directory, os.W_OK)


def no_symlinks_error(exc: OSError, root: Root, what: str) -> SymlinksUnsupportedError:
    """The error for an alias ``symlink()`` refused with ``exc``; ``what`` begins it."""
    return SymlinksUnsupportedError(
        f"{what} cannot be made: {root.path} is on a filesystem that makes no symlinks "
        f"({os.strerror(exc.errno or errno.EOPNOTSUPP)}: vfat, exFAT and some SMB mounts "
        "refuse them), and an alias is a symlink. Commit there without aliases= (the "
        "best pointer needs no symlink), or put the root on a filesystem with symlinks",
        path=root.path,
        code=exc.errno or errno.EOPNOTSUPP,
    )


def aliases_of(root: Root, names: set[str]) -> list[Path]:
    """The symlinks in the root (aliases; never the best pointer) that name one of ``names``."""
    found: list[Path] = []
    with os.scandir(root.path) as it:
        for de in it:
            if de.name == BEST_LINK or TMP_INFIX in de.name or not de.is_symlink():
                continue
            try:
                if os.readlink(de.path) in names:
                    found.append(Path(de.path))
            except OSError:
                continue
    return sorted(found)


def drop_aliases(root: Root, name: str, *, keep: list[str]) -> None:
    """Remove the aliases naming ``name`` that are not in ``keep``, durably (under the
    root lock): the step's older save is about to be replaced, and they would lie."""
    stale = [a for a in aliases_of(root, {name}) if a.name not in keep]
    for alias in stale:
        with contextlib.suppress(FileNotFoundError):
            _fs.unlink(alias)
    if stale:
        root.sync.root(root.path)


def remove_alias(root: Root, alias: str) -> None:
    """Remove one alias durably; CheckpointNotFoundError if there is no such alias."""
    check_alias(root, alias)
    path = root.path / alias
    with root.locked():
        if not os.path.islink(path):
            raise CheckpointNotFoundError(
                f"no alias {alias!r} in {root.path}"
                + (" (that name is not a symlink)" if os.path.lexists(path) else ""),
                path=path,
            )
        _fs.unlink(path)
        root.sync.root(root.path)


def remove_aliases(root: Root, names: set[str]) -> list[Path]:
    """Remove the aliases naming the (deleted) directories ``names`` (under the root
    lock; the caller fsyncs the root), so none is ever left dangling; the ones removed."""
    found = aliases_of(root, names)
    for alias in found:
        with contextlib.suppress(FileNotFoundError):
            _fs.unlink(alias)
    return found


def refuse_alias(root: Root, name: str, arg: str) -> None:
    """CheckpointNotFoundError if ``name``, given as the argument ``arg`` (``from_``), is
    an alias in the root (a symlink naming a step: ``aliases=``, or the best pointer),
    saying which step to pass instead: ``arg`` names a checkpoint itself, never a link
    that may move meanwhile."""
    if "/" in name or os.sep in name:
        return
    try:
        target = os.readlink(root.path / name)
    except (OSError, ValueError):
        return  # not a symlink (or not there): the caller's checks say what it is
    step = parse_step(target, root.prefix) if "/" not in target else None
    names = f"step {step}, so pass {arg}={step}" if step is not None else repr(target)
    raise CheckpointNotFoundError(
        f"{name!r} in {root.path} is an alias (a symbolic link naming {names}), not a "
        f"checkpoint: {arg}= takes a step or a named checkpoint's name. Nothing was done",
        path=root.path / name,
    )


# --------------------------------------------------------------------------- the best pointer


POINTER_MAX = 1024
"""Bytes read of a pointer file at most: a directory name (255 bytes) and a newline."""


def _read_pointer_file(path: Path) -> str | None:
    """The name a ``checkpoint_best`` *file* holds (the pointer where the filesystem makes
    no symlinks), or None: not a regular file (never followed, never waited on: a FIFO is
    opened non-blocking and refused), too long, or not UTF-8."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, POINTER_MAX + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > POINTER_MAX:
        return None
    try:
        return data.decode("utf-8").removesuffix("\n")
    except UnicodeDecodeError:
        return None


def best_step(root: Root) -> int | None:
    """The step ``checkpoint_best`` names (a symlink, or where the filesystem makes no
    symlinks a file holding the name), or None (none, or not a step name)."""
    path = root.path / BEST_LINK
    try:
        target: str | None = os.readlink(path)
    except OSError as exc:  # missing, not a symlink, or a name too long
        target = _read_pointer_file(path) if exc.errno == errno.EINVAL else None
    if target is None:
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
    try:
        return require_complete(root, step)
    except (CheckpointNotFoundError, ValueError):  # ValueError: a step no name can hold
        log.warning("%s names no complete checkpoint", root.path / BEST_LINK)
        return None


def set_best_locked(root: Root, ckpt: Checkpoint) -> None:
    """Point ``checkpoint_best`` at ``ckpt`` atomically and durably (under the root lock).

    A new symlink under a ``.tmp-`` name (which ``clean()`` removes if we crash)
    is renamed over the old one, then the root is fsynced. Where the filesystem makes no
    symlinks (a refusal in a root we may write), the same with a small file holding the
    name (written and fsynced under the ``.tmp-`` name first), warned once per root.
    """
    tmp = root.path / root.tmp_name(BEST_LINK, new_token())
    try:
        _fs.symlink_replace(ckpt.path.name, root.path / BEST_LINK, tmp)
    except OSError as exc:
        if not symlinks_refused(exc, root.path):
            raise
        if root.path not in _warned_no_symlinks:
            _warned_no_symlinks.add(root.path)
            log.warning(
                "%s makes no symlinks (%s): %s is a file naming the best checkpoint "
                "instead (replaced atomically and durably; best(), retain() and delete() "
                "read it)",
                root.path,
                os.strerror(exc.errno) if exc.errno else exc,
                BEST_LINK,
            )
        data = f"{ckpt.path.name}\n".encode()
        _fs.write_file_durable(root.path / BEST_LINK, data, tmp=tmp, sync=root.sync.durable)
    root.sync.root(root.path)


_warned_no_symlinks: set[Path] = set()


def set_best(root: Root, step: int) -> Checkpoint:
    """Point ``checkpoint_best`` at the complete checkpoint of ``step``, durably."""
    require_complete(root, step)  # a missing root (or step) before its lock: not found
    with root.locked():
        ckpt = require_complete(root, step)
        set_best_locked(root, ckpt)
    return ckpt


def delete(root: Root, step: int, *, force: bool) -> Path:
    """Delete one step durably (moved out of sight first, marker first on removal).

    Refuses the step ``checkpoint_best`` names unless ``force`` (the pointer then
    goes too). The latest step may be deleted.
    """
    require_complete(root, step)  # a missing root (or step) before its lock: not found
    with root.locked():
        ckpt = require_complete(root, step)
        is_best = best_step(root) == step
        if is_best:
            if not force:
                raise StepConflictError(
                    f"{ckpt.path} is the best checkpoint ({BEST_LINK} names it): pass "
                    "force=True to delete it and the pointer",
                    path=ckpt.path,
                    step=step,
                )
            _fs.unlink(root.path / BEST_LINK)
        moved = move_aside(root, [ckpt.path], unlinked=is_best)
    remove_moved(root, moved)
    return ckpt.path


def delete_named(root: Root, name: str) -> Path:
    """Delete the complete named checkpoint ``name`` durably, as :func:`delete` a step."""
    with root.locked():
        path = root.path / name
        if (
            not os.path.isdir(path)
            or os.path.islink(path)
            or _stage.read_marker_or_none(path) is None
        ):
            raise CheckpointNotFoundError(
                f"no complete named checkpoint {name!r} in {root.path}", path=path
            )
        moved = move_aside(root, [path])
    remove_moved(root, moved)
    return path


def require_complete(root: Root, step: int) -> Checkpoint:
    """The complete checkpoint of ``step`` (read under the caller's lock)."""
    path = root.path / root.name_of(step)
    isdir = os.path.isdir(path) and not os.path.islink(path)
    entry = classify(path, step) if isdir else None
    if entry is None or entry.manifest is None:
        raise CheckpointNotFoundError(
            f"no complete checkpoint for step {step} in {root.path}"
            + (f": {entry.problem}" if entry is not None and entry.problem else ""),
            path=path,
            step=step,
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
    return remove_moved(root, moved)
