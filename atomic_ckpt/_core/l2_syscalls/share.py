"""Share a committed file's storage with a new name: a reflink, a hard link, or a copy.

Beside :mod:`.fs` (and hooked the same way: callers look the function up on this module
when they call it). Nothing here makes the new name durable: a reflink or a copy is a
new file whose data the caller fsyncs, a hard link a new entry whose directory the
caller fsyncs (a commit's tree walk does both for every file of its staging dir).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import Literal

from atomic_ckpt._core.l2_syscalls.errnos import HARDLINK_REFUSED, REFLINK_REFUSED
from atomic_ckpt._core.l2_syscalls.fs import NotRegularFileError, _open_parent

__all__ = ["FICLONE", "Method", "make_at", "move_at", "open_dirs", "share_file"]

Method = Literal["reflink", "hardlink", "copy"]
"""How a file was carried: a reflink shares extents copy-on-write (btrfs, xfs), a hard
link shares the inode itself, a copy shares nothing."""

FICLONE = 0x40049409
"""Linux ``ioctl(dst, FICLONE, src)``: make ``dst`` share ``src``'s extents."""

_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _permissions(fd_in: int) -> int:
    """The permission bits of the file open as ``fd_in``, for a new inode sharing its
    bytes: a hard link has the source's mode, so a reflink or a copy gets it too (an
    executable script stays one). Never the set-id or sticky bits: a copy this process
    makes is no privilege the source's owner granted."""
    return stat.S_IMODE(os.fstat(fd_in).st_mode) & 0o777


def _reflink(fd_in: int, dst: Path) -> bool:
    """``dst`` made a new file sharing ``fd_in``'s extents (and its permission bits);
    False (nothing left) if the filesystem cannot."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not a POSIX system
        return False
    fd_out = os.open(dst, _NEW, 0o600)
    try:
        fcntl.ioctl(fd_out, FICLONE, fd_in)
    except OSError as exc:
        os.close(fd_out)
        os.unlink(dst)
        if exc.errno not in REFLINK_REFUSED:
            raise
        return False
    try:
        os.fchmod(fd_out, _permissions(fd_in))
    except BaseException:
        os.close(fd_out)
        os.unlink(dst)
        raise
    os.close(fd_out)
    return True


def _copy(fd_in: int, dst: Path) -> None:
    """``dst`` made a new file holding ``fd_in``'s bytes (and its permission bits)."""
    fd_out = os.open(dst, _NEW, 0o600)
    try:
        while os.sendfile(fd_out, fd_in, None, 1 << 30):
            pass
        os.fchmod(fd_out, _permissions(fd_in))
    except BaseException:
        os.close(fd_out)
        with contextlib.suppress(OSError):
            os.unlink(dst)
        raise
    os.close(fd_out)


def share_file(
    top_fd: int,
    rel: str,
    dst: Path,
    *,
    expect: os.stat_result | None = None,
    methods: tuple[Method, ...] = ("reflink", "hardlink", "copy"),
) -> tuple[Method, os.stat_result]:
    """Make the new name ``dst`` hold the regular file ``rel`` below the directory open
    as ``top_fd``, by the first of ``methods`` the filesystem allows; return the method
    and the source's ``stat``.

    ``rel`` is walked from ``top_fd`` one component at a time, never following a
    symlink (OSError ELOOP or ENOTDIR if one is on it). :class:`~.fs.NotRegularFileError`
    if the source is not a regular file, is not ``expect`` (same device and inode), or
    was swapped while it was shared (whatever was made at ``dst`` is removed again).
    The source is only ever opened for reading.
    """
    parts = rel.split("/")
    parent = _open_parent(top_fd, parts[:-1])
    name = parts[-1]
    try:
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
        fd_in = os.open(name, flags, dir_fd=parent)
        try:
            st = os.fstat(fd_in)
            if not stat.S_ISREG(st.st_mode):
                raise NotRegularFileError(errno.EINVAL, "not a regular file", rel)
            if expect is not None and not os.path.samestat(st, expect):
                raise NotRegularFileError(errno.EAGAIN, "replaced before it was shared", rel)
            for method in methods:
                if method == "reflink" and _reflink(fd_in, dst):
                    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))  # see below
                    return method, st
                if method == "hardlink":
                    try:
                        os.link(name, dst, src_dir_fd=parent, follow_symlinks=False)
                    except OSError as exc:
                        if exc.errno not in HARDLINK_REFUSED:
                            raise
                        continue
                    if not os.path.samestat(os.lstat(dst), st):  # swapped meanwhile
                        os.unlink(dst)
                        raise NotRegularFileError(errno.EAGAIN, "replaced while linked", rel)
                    return method, st
                if method == "copy":
                    _copy(fd_in, dst)
                    # The source's mtime, as a hard link has: a new file stamped now
                    # would be racily clean (hashed to be carried on) at every carry.
                    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
                    return method, st
            raise OSError(errno.EOPNOTSUPP, f"none of {methods} is possible here", str(dst))
        finally:
            os.close(fd_in)
    finally:
        os.close(parent)


def open_dirs(top_fd: int, parts: list[str], *, create: bool = False) -> int:
    """The directory ``parts`` below ``top_fd``, opened one component at a time without
    following a symlink (OSError ELOOP or ENOTDIR if a component is a link or a file);
    ``create``: missing components are made (their mode follows the umask). The caller
    closes the descriptor; nothing here is fsynced (a commit's tree walk does it)."""
    return _open_parent(top_fd, parts, create=create)


def make_at(dir_fd: int, name: str, *, symlink: str | None = None) -> None:
    """Create the directory ``name`` (or, given ``symlink``, a symlink to that target,
    never followed) in the directory open as ``dir_fd``; FileExistsError if it exists."""
    if symlink is None:
        os.mkdir(name, dir_fd=dir_fd)
    else:
        os.symlink(symlink, name, dir_fd=dir_fd)


def move_at(src_fd: int, dst_fd: int, name: str, *, old: str | None = None) -> None:
    """Rename ``old`` (default: ``name``) from the directory open as ``src_fd`` to ``name``
    in the one open as ``dst_fd`` (same filesystem); FileExistsError if the new name
    exists (checked first: the callers hold a sealed commit, whose own block has ended)."""
    with contextlib.suppress(FileNotFoundError):
        os.stat(name, dir_fd=dst_fd, follow_symlinks=False)
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), name)
    os.rename(name if old is None else old, name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
