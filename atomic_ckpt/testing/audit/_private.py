"""The audits' private directory (where an original waits while crash states are shown
at its path) and the locks that keep two audits of one tree apart."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from atomic_ckpt.testing.audit._errors import AuditError
from atomic_ckpt.testing.audit._mounts import is_mount_point

PRIVATE = ".atomic-ckpt-audit"
"""The audits' own directory, at the top of the filesystem the audited directory is on."""


def _mount_top(path: Path) -> Path:
    """The mount point ``path`` is under: a bind mount from the same filesystem included
    (``os.path.ismount`` misses one, and a rename across it is EXDEV: s15 attack)."""
    path = Path(os.path.realpath(path))
    while not is_mount_point(path):
        path = path.parent
    return path


def private_dir(near: Path) -> Path:
    """A directory only audits use, on the filesystem of ``near`` (so that a rename parks
    the original there): ``.atomic-ckpt-audit`` at the top of that filesystem, else in
    the home directory if it is on it, else in ``near`` itself; mode 0700, this user's."""
    dev = os.stat(near).st_dev
    for base in (_mount_top(near) / PRIVATE, Path.home() / PRIVATE, near / PRIVATE):
        with contextlib.suppress(OSError):
            base.mkdir(mode=0o700, exist_ok=True)
            st = os.lstat(base)
            if (
                stat.S_ISDIR(st.st_mode)
                and st.st_dev == dev
                and st.st_uid == os.geteuid()
                and not st.st_mode & 0o077
            ):
                return base
    raise AuditError(
        f"found no private directory on the filesystem of {near} to keep the original in "
        f"while the audit runs: make {near / PRIVATE} a directory only you can write (mode 0700)"
    )


def _name(root: Path) -> str:
    digest = hashlib.sha256(
        os.fsencode(os.path.join(os.path.realpath(root.parent), root.name))
    ).hexdigest()[:20]
    return f"{root.name[:40]}-{digest}"


def aside_path(root: Path) -> Path:
    """Where the original ``root`` waits while crash states are shown at its path: in the
    audits' private directory, out of the workload's and the check's reach."""
    return private_dir(root.parent) / f"{_name(root)}.original"


def absent_path(root: Path) -> Path:
    """Where an audit of a ``root`` that did not exist notes so while it runs: what a
    killed one left there is a crash state, not the user's (s15 attack)."""
    return private_dir(root.parent) / f"{_name(root)}.absent"


@contextlib.contextmanager
def locked(root: Path) -> Iterator[None]:
    """Hold the lock on the name ``root`` (it need not exist) and a shared lock on the
    name of each directory above it: one audit at a time of a directory, and none of a
    directory while one of a directory inside it or above it runs (s15 attack: an audit of
    ckpts/ while one of ckpts/sub ran parked the inner audit's crash state as the
    original, and the user's files were lost). A lock file is removed when released by
    the last holder; a lock taken on a file removed meanwhile is retaken on the new one."""
    with contextlib.ExitStack() as held:
        fd = held.enter_context(_flock(root, fcntl.LOCK_EX))
        parent = Path(os.path.realpath(root.parent))
        for above in (p for p in (parent, *parent.parents) if p != p.parent):  # not "/"
            held.enter_context(_flock(above, fcntl.LOCK_SH, inside=root))
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}".encode(), 0)
        yield


@contextlib.contextmanager
def _flock(name: Path, how: int, inside: Path | None = None) -> Iterator[int]:
    """``flock(how)`` on the lock file of the name ``name``; a shared one (``inside``: the
    audited directory below ``name``) is skipped where no private directory can be made
    (no audit of ``name`` could run there either)."""
    try:
        lock = private_dir(name.parent) / f"{_name(name)}.lock"
    except AuditError:
        if inside is None:
            raise
        yield -1
        return
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
            holder = f" ({holder})" if holder else ""
            os.close(fd)
            if inside is not None:
                raise AuditError(
                    f"an audit of {name} is running{holder}; it shows crash states at "
                    f"that path, which holds {inside}: wait for it to end, then audit again"
                ) from None
            raise AuditError(
                f"another audit of {name} (or of a directory inside it) is running "
                f"{holder}; it shows crash states there: wait for it to "
                f"end, then audit again"
            ) from None
        with contextlib.suppress(FileNotFoundError):
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                break
        os.close(fd)  # its holder removed it as we opened it: take the new one
    try:
        yield fd
    finally:
        try:  # the last holder removes it (a shared one that can take it alone is last)
            if how == fcntl.LOCK_EX or _alone(fd):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(lock)
        finally:
            os.close(fd)


def _alone(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
