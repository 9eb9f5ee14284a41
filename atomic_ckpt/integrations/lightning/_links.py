"""The ``last`` link of :mod:`atomic_ckpt.integrations.lightning`: replaced atomically (also
over a sharded ``last.ckpt/`` directory), or written as an atomic, durable copy where the
filesystem makes no symlinks, as Lightning's own ``ModelCheckpoint`` falls back to."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from atomic_ckpt import atomic_write, remove_directory, replace_symlink, temp_name
from atomic_ckpt._core.l2_syscalls import fs as _fs
from atomic_ckpt._core.l2_syscalls import locks as _locks
from atomic_ckpt._core.l2_syscalls.errnos import SYMLINK_REFUSED

log = logging.getLogger("atomic_ckpt.integrations.lightning")


def _replace_link(target: str, linkpath: str, *, durable: bool) -> None:
    """:func:`atomic_ckpt.replace_symlink`, also where ``linkpath`` is a directory (a sharded
    ``last.ckpt/`` saved as a copy, before ``save_last="link"``): the stock callback removes
    it and then links, leaving no ``last`` between the two. Here a new link is exchanged
    with the directory (``RENAME_EXCHANGE``: ``last`` is never absent), and the old
    directory, now under the link's temporary name, removed. Where the filesystem cannot
    exchange, the directory is removed first, as the stock callback does."""
    path = Path(linkpath)
    if not (path.is_dir() and not path.is_symlink()):
        try:
            replace_symlink(target, linkpath, durable=durable)
        except OSError as exc:
            if not _symlinks_refused(exc, path.parent):
                raise
            _copy_instead(target, path, exc, durable=durable)
        return
    # The new link, then the old directory, under a temporary name: a write in progress
    # to clean_temporaries (another fit's setup), which leaves the directory alone.
    with _locks.writing_in(path.parent):
        tmp = path.parent / temp_name(path.name)
        try:
            _fs.symlink(target, tmp)
        except OSError as exc:
            if not _symlinks_refused(exc, path.parent):
                raise
            if not (path.parent / target).is_dir():  # (a directory is refused by the copy)
                remove_directory(path, durable=durable)  # then the copy, as the stock callback does
            _copy_instead(target, path, exc, durable=durable)
            return
        try:
            _fs.rename_exchange(tmp, path)
        except OSError as exc:
            _fs.unlink(tmp)
            if exc.errno not in _fs.EXCHANGE_UNSUPPORTED:
                raise
            remove_directory(path, durable=durable)
            replace_symlink(target, linkpath, durable=durable)
            return
        remove_directory(tmp, durable=durable)  # the old directory; the parent fsynced too


_SYMLINK_REFUSALS: frozenset[int | None] = SYMLINK_REFUSED | {None}
"""What ``symlink()`` fails with on a filesystem without symlinks (the core's
``SYMLINK_REFUSED``: vfat, exFAT, some SMB mounts); and an OSError that names no errno at
all (what Lightning's own tests raise for Windows without the symlink privilege), on which
the stock callback copies too."""

_warned_copy: set[Path] = set()


def _symlinks_refused(exc: OSError, directory: Path) -> bool:
    """Whether ``exc`` (wrapped or not) says ``directory``'s filesystem makes no symlinks,
    rather than that the directory cannot be written at all."""
    cause = exc.__cause__ if isinstance(exc.__cause__, OSError) else exc
    return cause.errno in _SYMLINK_REFUSALS and os.access(directory, os.W_OK)


def _copy_instead(target: str, path: Path, exc: OSError, *, durable: bool) -> None:
    """``last`` as a copy of ``target`` where the filesystem refuses symlinks, as the stock
    callback falls back to, but atomic and durable (:func:`atomic_ckpt.atomic_write`)."""
    source = path.parent / target
    if source.is_dir():
        raise OSError(
            exc.errno,
            f"cannot link {path} to the directory {source}: this filesystem makes no "
            "symlinks, and a sharded checkpoint is not copied; use save_last=True",
        ) from exc
    if path.parent not in _warned_copy:
        _warned_copy.add(path.parent)
        cause = exc.__cause__ if isinstance(exc.__cause__, OSError) else exc
        log.warning(
            "%s refuses symlinks (%s): %s is written as a copy of %s instead (atomically), "
            "as Lightning's ModelCheckpoint does",
            path.parent,
            os.strerror(cause.errno) if cause.errno else repr(cause),
            path.name,
            target,
        )
    with atomic_write(path, durable=durable) as tmp:
        shutil.copyfile(source, tmp)
