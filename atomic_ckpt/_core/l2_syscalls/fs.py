"""The one module that makes the durability syscalls.

Everything that must reach stable storage (fsync of a file or directory, the
atomic renames, the durable write of a small file) goes through here, so the
fault-injection and power-loss tests hook exactly one place.

Platform choices are made once, at import:

* Linux: ``fsync``; ``renameat2(2)`` through ctypes for ``RENAME_NOREPLACE``
  and ``RENAME_EXCHANGE``.
* macOS: ``fcntl(F_FULLFSYNC)``, because plain ``fsync`` there only hands the
  data to the drive, which may keep it in a volatile cache.
* Windows: directories cannot be opened for fsync, so directory fsync is a
  no-op there; renames use ``os.rename``/``os.replace``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path

from atomic_ckpt._core.l1_names.names import MARKER
from atomic_ckpt._core.l2_syscalls._native import (
    _CAN_FSYNC_DIRS,
    _FULLFSYNC,
    _RENAME_EXCHANGE,
    _RENAME_NOREPLACE,
    _renameat2,
    _renameat2_or_raise,
    _sync_file_range,
)
from atomic_ckpt._core.l2_syscalls.errnos import EXCHANGE_UNSUPPORTED, HARDLINK_REFUSED
from atomic_ckpt._core.l2_syscalls.forksafe import ProcessLock

__all__ = [
    "EXCHANGE_UNSUPPORTED",
    "NotRegularFileError",
    "fsync_dir",
    "fsync_entry_once",
    "fsync_fd",
    "fsync_file",
    "link_or_copy",
    "makedirs",
    "mkdir",
    "open_dir",
    "remove_tree",
    "rename",
    "rename_exchange",
    "rename_noreplace",
    "replace_by_moving_aside",
    "start_writeback",
    "symlink",
    "symlink_replace",
    "unlink",
    "write_file_durable",
]


def start_writeback(fd: int, offset: int, length: int) -> bool:
    """Ask the kernel to start writing ``length`` bytes of ``fd`` from ``offset`` to disk,
    without waiting (Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``).

    A hint, never a durability step: it flushes no metadata and no drive cache, so
    the file's fsync must still follow. It lets the disk work while the writer is
    still producing data, so that fsync has less left to wait for. Returns False
    where it is not available (other systems, a file that does not support it);
    a write error is not reported here but by the fsync that follows.
    """
    if _sync_file_range is None or length <= 0:
        return False
    return _sync_file_range(fd, offset, length) == 0


def start_file_writeback(path: str | os.PathLike[str], offset: int = 0, length: int = 0) -> bool:
    """:func:`start_writeback` for ``length`` bytes from ``offset`` (0: to the end) of the
    regular file ``path``, opened by path, never through a symlink. A hint: False,
    not an OSError, when it could not be taken (the fsync that must follow reports
    any problem)."""
    if _sync_file_range is None:
        return False
    try:
        # O_NONBLOCK: a FIFO swapped in for the file must not hang the commit here.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return False
        return start_writeback(fd, offset, length or st.st_size - offset)
    except OSError:
        return False
    finally:
        os.close(fd)


def fsync_fd(fd: int) -> None:
    """Flush one open file's data and metadata to stable storage."""
    if _FULLFSYNC is not None:
        import fcntl

        fcntl.fcntl(fd, _FULLFSYNC)
    else:
        os.fsync(fd)


def fsync_file(path: str | os.PathLike[str]) -> None:
    """fsync a regular file by path (never following a symlink)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        fsync_fd(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory, which makes the entries created, renamed or removed in it durable.

    A no-op where directories cannot be fsynced (Windows).
    """
    if not _CAN_FSYNC_DIRS:
        return
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags | getattr(os, "O_NOFOLLOW", 0))
    try:
        fsync_fd(fd)
    finally:
        os.close(fd)


_DURABLE_ENTRIES: set[tuple[int, int]] = set()
"""(device, inode) of the directories whose own entry this process made durable."""
_DURABLE_ENTRIES_LOCK = ProcessLock()


def fsync_entry_once(
    directory: Path, fsync_parent: Callable[[Path], None] | None = None, *, done: bool = False
) -> None:
    """Make ``directory``'s own entry in its parent durable: fsync the parent, once per
    process and directory (by inode, so a directory made again is fsynced again).

    For a directory someone else created with a plain ``makedirs`` (a framework's output
    directory): until its parent is fsynced, a power loss can take it, with everything
    committed inside. ``done``: the caller has just fsynced the parent (it created the
    directory); only remember it. A parent this process may not open (execute-only) is
    left alone: its entry is then as durable as whoever made it left it.
    ``fsync_parent`` defaults to :func:`fsync_dir` (looked up when called, so that the
    testing recorder's hook sees it).
    """
    st = os.stat(directory)
    key = (st.st_dev, st.st_ino)
    with _DURABLE_ENTRIES_LOCK:
        if key in _DURABLE_ENTRIES:
            return
    if not done:
        with contextlib.suppress(PermissionError):
            (fsync_parent or fsync_dir)(directory.parent)
    with _DURABLE_ENTRIES_LOCK:
        _DURABLE_ENTRIES.add(key)


def rename_noreplace(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst``, failing with FileExistsError if ``dst`` exists.

    Linux uses ``renameat2(RENAME_NOREPLACE)``, which is atomic. Where the kernel
    or filesystem refuses it, the fallback checks then renames; callers hold the
    root lock, so no writer of this library can race the check.
    """
    if _renameat2 is not None:
        try:
            _renameat2_or_raise(src, dst, _RENAME_NOREPLACE)
            return
        except OSError as exc:
            if exc.errno not in EXCHANGE_UNSUPPORTED:
                raise
    if os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst))
    os.rename(src, dst)


def rename_exchange(a: Path, b: Path) -> None:
    """Atomically swap two names with ``renameat2(RENAME_EXCHANGE)``.

    Raises OSError with an errno in :data:`EXCHANGE_UNSUPPORTED` where the
    platform, kernel or filesystem cannot; the caller falls back.
    """
    if _renameat2 is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available on this platform", str(a))
    _renameat2_or_raise(a, b, _RENAME_EXCHANGE)


def rename(src: Path, dst: Path) -> None:
    """A plain rename (replaces an empty directory or a file at ``dst``)."""
    os.rename(src, dst)


def replace_by_moving_aside(staging: Path, final: Path, aside: Path, *, repair: str) -> None:
    """Replace ``final`` with ``staging`` where the filesystem cannot exchange them: the old
    copy is renamed to ``aside``, then ``staging`` to ``final``. Between the two there is no
    ``final``; if the second rename fails the old copy is moved back, and if that fails
    too the error says where it is and what brings it back (``repair``)."""
    rename(final, aside)
    try:
        rename_noreplace(staging, final)
    except BaseException as exc:
        try:
            rename(aside, final)
        except OSError as undo:
            exc.add_note(
                f"atomic_ckpt: moving the old copy back to {final} also failed ({undo!r}); "
                f"it is intact at {aside}, and {repair}"
            )
        raise


def write_file_durable(path: Path, data: bytes, *, tmp: Path | None, sync: bool) -> None:
    """Write ``data`` to ``path``: through ``tmp`` (fsynced, then renamed) when given.

    The file is always a new one (``O_EXCL | O_NOFOLLOW``): without ``tmp``,
    whatever sat at ``path`` is unlinked first, so a hard link, a symlink or a FIFO
    planted there is replaced, never written through. The directory holding
    ``path`` is not fsynced here; the caller does it once. If anything fails,
    ``tmp`` is removed (a stray temporary is never left behind).
    """
    target = tmp if tmp is not None else path
    if tmp is None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(target, flags, 0o666)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if sync:
                fsync_fd(fd)
        finally:
            os.close(fd)
        if tmp is not None:
            os.replace(tmp, path)
    except BaseException:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise


_DIR_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_DIRECTORY", 0)
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
)


class NotRegularFileError(OSError):
    """An entry that must be a regular file is something else (a symlink, a FIFO, a
    directory...), or was swapped for another file while it was being linked."""


def open_dir(path: str | os.PathLike[str]) -> int:
    """Open the directory ``path`` (never through a symlink at its last component) for
    the ``*_at`` calls below; the caller closes the descriptor.

    Holding it pins the directory's identity: its inode cannot be reused while it is open.
    """
    return os.open(path, _DIR_FLAGS)


def _open_parent(top_fd: int, parts: list[str], *, create: bool = False) -> int:
    """The directory ``parts`` below ``top_fd``, opened one component at a time, never
    following a symlink (OSError ELOOP or ENOTDIR if a component is a link or a file);
    ``create``: missing components are made (their mode follows the umask)."""
    fd = os.dup(top_fd)
    try:
        for part in parts:
            if part in ("", ".", ".."):
                raise OSError(errno.EINVAL, f"{part!r} is not a name inside the tree")
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, dir_fd=fd)
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def link_or_copy(src: Path, dst: Path, *, top: Path, top_fd: int) -> bool:
    """Make ``dst`` a hard link to the regular file ``src``, or a copy where the
    filesystem refuses links; True if it had to copy (the copy is not fsynced here).

    ``src`` lies below the directory ``top``, open as ``top_fd`` (:func:`open_dir`): its
    path is walked from that descriptor one component at a time and no symlink on it is
    ever followed (PROTOCOL.md: a link found inside a checkpoint is never followed), so
    a directory of the tree replaced by a link to elsewhere raises OSError (ELOOP or
    ENOTDIR) instead of bringing in a file from outside. :class:`NotRegularFileError`
    if ``src`` is not a regular file, or was swapped while it was being linked (the
    link made is removed again).
    """
    parts = src.relative_to(top).parts
    if not parts:
        raise NotRegularFileError(errno.EISDIR, "not a file below the tree", str(src))
    parent = _open_parent(top_fd, list(parts[:-1]))
    name = parts[-1]
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFileError(errno.EINVAL, "not a regular file", str(src))
        try:
            os.link(name, dst, src_dir_fd=parent, follow_symlinks=False)
        except OSError as exc:
            if exc.errno not in HARDLINK_REFUSED:
                raise
        else:
            if not os.path.samestat(os.lstat(dst), st):  # swapped between stat and link
                os.unlink(dst)
                raise NotRegularFileError(errno.EAGAIN, "replaced while linked", str(src))
            return False
        flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC
        fd_in = os.open(name, flags, dir_fd=parent)
        try:
            if not os.path.samestat(os.fstat(fd_in), st):
                raise NotRegularFileError(errno.EAGAIN, "replaced while copied", str(src))
            out_flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd_out = os.open(dst, out_flags, 0o666)
            try:
                while os.sendfile(fd_out, fd_in, None, 1 << 30):
                    pass
            finally:
                os.close(fd_out)
        finally:
            os.close(fd_in)
        return True
    finally:
        os.close(parent)


def mkdir(path: Path) -> None:
    """Create one directory; its mode follows the umask, like any ``mkdir``."""
    os.mkdir(path)


def unlink(path: Path) -> None:
    """Remove one file or symlink (never a directory)."""
    os.unlink(path)


def symlink(target: str, link: Path) -> None:
    """Create the symlink ``link`` pointing at ``target`` (never followed here)."""
    os.symlink(target, link)


def symlink_replace(target: str, link: Path, tmp: Path) -> None:
    """Point the symlink ``link`` at ``target`` atomically: a new link at ``tmp``, renamed over.

    The directory is not fsynced here; the caller does it. On failure ``tmp`` is gone
    and ``link`` is untouched.
    """
    os.symlink(target, tmp)
    try:
        rename(tmp, link)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def makedirs(path: Path) -> list[Path]:
    """``mkdir -p path``; return the directories that were missing, outermost first.

    The caller fsyncs the parent of each: a directory's entry lives in its parent,
    and without that fsync a power loss can drop a freshly created root together
    with every checkpoint committed into it.
    """
    missing: list[Path] = []
    p = path
    while not os.path.lexists(p) and p.parent != p:
        missing.append(p)
        p = p.parent
    path.mkdir(parents=True, exist_ok=True)
    return missing[::-1]


def remove_tree(path: Path) -> None:
    """Remove a directory tree without following symlinks; a missing path is fine.

    The marker goes first, so a tree interrupted halfway never looks complete.
    Iterative, so a legally deep tree (thousands of levels) is removed too. Each
    directory is opened without following a link and checked to be the one its parent
    listed before anything in it is removed (through that descriptor): a directory
    replaced by a symlink meanwhile has the link removed, never what it points to.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return
    with contextlib.suppress(FileNotFoundError, IsADirectoryError, NotADirectoryError):
        os.unlink(path / MARKER)
    # Depth first, children before their parent: (directory, what its parent listed,
    # its children are gone).
    stack: list[tuple[str, os.stat_result, bool]] = [(os.fspath(path), st, False)]
    while stack:
        directory, listed, emptied = stack.pop()
        if emptied:
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(directory)
            continue
        try:
            fd = os.open(directory, _DIR_FLAGS)
        except FileNotFoundError:
            continue
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            with contextlib.suppress(FileNotFoundError):
                os.unlink(directory)  # it became a link or a file: removed, never followed
            continue
        try:
            if not os.path.samestat(os.fstat(fd), listed):  # swapped for another directory
                raise OSError(
                    errno.ESTALE, "replaced by another directory while it was removed", directory
                )
            stack.append((directory, listed, True))
            with os.scandir(fd) as it:
                for entry in it:
                    if entry.is_dir(follow_symlinks=False):
                        child = entry.stat(follow_symlinks=False)
                        stack.append((os.path.join(directory, entry.name), child, False))
                    else:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(entry.name, dir_fd=fd)
        finally:
            os.close(fd)
