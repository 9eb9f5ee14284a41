"""What interrupted one-file writes left in a directory, repaired, never a write in progress.

:func:`clean_temporaries` removes the temporaries of :mod:`.onefile`'s writes that a crash
interrupted and puts back an old directory a fallback replace had moved aside. It takes
the directory's own lock exclusively first; every write of :mod:`.onefile` holds it shared
while its temporary exists, so a live write (another process's training saving into the
same directory) is never touched.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from atomic_ckpt._core.l2_syscalls import fs as _fs
from atomic_ckpt._core.l2_syscalls import locks as _locks
from atomic_ckpt._core.l4_protocol.onefile import (
    _ASIDE_RE,
    _TEMP_RE,
    PathLike,
    _raise_wrapped,
    temp_name,
)

__all__ = ["clean_temporaries"]

log = logging.getLogger(__name__)


def clean_temporaries(directory: PathLike, *, durable: bool = True) -> list[Path]:
    """Repair what interrupted writes left in ``directory``; returns the paths it removed
    or put back.

    An old directory that :func:`commit_directory` had moved aside
    (``.<name>.tmp-old-<hex>``) is renamed back to ``<name>`` if that is missing (the
    crash came before the new one took its place); if ``<name>`` exists it is stale
    and removed, after the directory is fsynced. Several asides of one missing name
    (which commit_directory never leaves) are all kept, with a warning: which one is
    the latest cannot be told. Temporary files, links and directories
    (``.<name>.tmp-<32 hex>``) are removed.

    Never while a write is in progress in ``directory``: every :func:`atomic_write`,
    :func:`write_bytes_atomic`, :func:`replace_symlink`, :func:`commit_directory` and
    :func:`remove_directory` holds a shared lock on the directory while its temporary
    exists there (any process, any thread), and this takes it exclusively without
    waiting; while one is held it removes nothing, logs why and returns an empty list
    (the next call cleans). Where the directory cannot be locked at all (some network
    filesystems) it cleans as before that lock existed: call it only while nothing
    writes there. A staging directory a caller fills before :func:`commit_directory`
    is not covered while it is being filled.
    """
    real = Path(os.path.realpath(directory))
    try:
        held = _locks.lock_directory(real)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:  # cannot lock here: the caller's word that nothing writes
        log.debug("cannot lock %s (%s): cleaning without the lock", real, exc)
        return _clean(real, durable=durable)
    if held is None:
        log.info(
            "%s: a write is in progress there (another process or thread): leaving its "
            "temporaries alone; the next clean removes what interrupted writes left",
            real,
        )
        return []
    try:
        return _clean(real, durable=durable)
    finally:
        held.release()


def _clean(real: Path, *, durable: bool) -> list[Path]:
    try:
        names = sorted(os.listdir(real))
    except (FileNotFoundError, NotADirectoryError):
        return []
    asides: dict[str, list[Path]] = {}
    for name in names:
        if (found := _ASIDE_RE.fullmatch(name)) is not None:
            asides.setdefault(found["name"], []).append(real / name)
    touched: list[Path] = []
    doomed = [real / name for name in names if _TEMP_RE.fullmatch(name) is not None]
    try:
        for target_name, copies in asides.items():
            target = real / target_name
            if os.path.lexists(target):  # the new one took its place: these are stale
                for stale in copies:
                    # Under a plain temporary name first: a kill while it is removed
                    # leaves a temporary, never a half-removed copy that could be put back.
                    retired = real / temp_name(stale.name)
                    _fs.rename(stale, retired)
                    doomed.append(retired)
                    touched.append(stale)
            elif len(copies) == 1:
                _fs.rename_noreplace(copies[0], target)
                touched.append(copies[0])
            else:
                log.warning(
                    "%s is missing and %d old copies of it were left aside (%s): keeping "
                    "them all; rename the one you want back to %s",
                    target,
                    len(copies),
                    ", ".join(c.name for c in copies),
                    target_name,
                )
        if touched and durable:
            _fs.fsync_dir(real)  # what is put back, and the retired names, before removals
        for path in doomed:
            _fs.remove_tree(path)  # a file or a tree; links are never followed
        touched += [p for p in doomed if _TEMP_RE.fullmatch(p.name) and p.name in names]
        if doomed and durable:
            _fs.fsync_dir(real)
    except OSError as exc:
        _raise_wrapped(exc, real)
        raise
    return touched
