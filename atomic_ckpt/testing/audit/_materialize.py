"""Put crash states on disk: lock the audited path, park the original in the audits'
private directory, show one state after another at its path (changing only what differs
from the last one, never through a symlink), and put the original back."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import stat
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import FrameType
from typing import Any

from atomic_ckpt.testing._sparse import Data, stored, text, write_to
from atomic_ckpt.testing._sparse import copy as copy_sparse
from atomic_ckpt.testing._states import _Flat
from atomic_ckpt.testing.audit._errors import AuditError
from atomic_ckpt.testing.audit._mounts import detach_mounts, is_mount_point
from atomic_ckpt.testing.audit._private import absent_path, aside_path, locked

_Key = tuple[int, int, int, int]


def _key(st: os.stat_result) -> _Key:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _kind(st: os.stat_result) -> str:
    return "symlink" if stat.S_ISLNK(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode) else "file"


def _open_root(target: Path) -> int:
    """A descriptor of the directory at ``target``, never through a symlink: a link (or a
    file) a check or the workload left at the root is removed, not followed."""
    try:
        st: os.stat_result | None = os.lstat(target)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        os.unlink(target)
        st = None
    if st is None:
        os.mkdir(target)
    return os.open(target, _DIR)


PATH_MAX = 4096
"""Linux's limit on a path passed to a system call, its terminating NUL included."""


def walk_tree(tree: Path) -> Iterator[tuple[str, os.stat_result, int, str]]:
    """Every entry below ``tree``, parents first, by name: (its path relative to ``tree``,
    its ``lstat``, a descriptor of its directory, its name). Each directory is opened from
    its parent's descriptor with ``O_NOFOLLOW``: no symlink is followed and no path longer
    than PATH_MAX is needed (round 15); the descriptor is valid until the next item."""
    stack: list[tuple[int, str, Iterator[str]]] = []
    try:
        top = os.open(tree, _DIR)
        stack.append((top, "", iter(sorted(os.listdir(top)))))
        while stack:
            fd, rel, names = stack[-1]
            name = next(names, None)
            if name is None:
                os.close(stack.pop()[0])
                continue
            try:
                st = os.lstat(name, dir_fd=fd)
            except FileNotFoundError:
                continue
            yield rel + name, st, fd, name
            if stat.S_ISDIR(st.st_mode):
                sub = os.open(name, _DIR, dir_fd=fd)
                stack.append((sub, f"{rel}{name}/", iter(sorted(os.listdir(sub)))))
    except OSError as exc:
        if exc.errno != errno.EMFILE:
            raise
        raise AuditError(
            f"{tree} is nested deeper than this process may hold open directories ({exc}); "
            f"raise the limit (ulimit -n) or audit a shallower tree; nothing was judged"
        ) from None
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def hard_linked(tree: Path) -> list[str]:
    """Files under ``tree`` with more than one name (issue 29.6, 29.12): a copy would
    split them, and a name outside the tree would change them unseen; the audit refuses."""
    return [
        rel for rel, st, _, _ in walk_tree(tree) if stat.S_ISREG(st.st_mode) and st.st_nlink > 1
    ]


def refuse_long_paths(tree: Path, root: Path) -> None:
    """Refuse (:class:`AuditError`) a tree one of whose paths, spelled at ``root``, is
    PATH_MAX or longer: the audit copies and replays it by path (round 15)."""
    base = len(os.fsencode(root)) + 1
    for rel, _, _, _ in walk_tree(tree):
        if base + len(os.fsencode(rel)) >= PATH_MAX:
            raise AuditError(
                f"{root} holds a path of {base + len(os.fsencode(rel))} bytes or more (from "
                f"{rel[:60]}...), past PATH_MAX ({PATH_MAX}): the audit copies the directory "
                f"by path; shorten its names or nesting, then audit again; nothing was judged"
            )


_SPECIAL = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def refuse_special(tree: Path, root: str) -> None:
    """Refuse (:class:`AuditError`) a tree holding nodes that are no regular file,
    directory or symlink, naming each: the crash states hold only those three, and copying
    a FIFO would block until a writer opens it (found by ``lstat`` alone: none is opened)."""
    found: list[str] = []
    for rel, st, _, _ in walk_tree(tree):
        what = _SPECIAL.get(stat.S_IFMT(st.st_mode))
        if what is not None:
            found.append(f"{rel} is {what}")
    if found:
        more = f" (and {len(found) - 5} more)" if len(found) > 5 else ""
        raise AuditError(
            f"{root} holds what a crash state cannot: {'; '.join(found[:5])}{more}. The "
            f"crash states hold regular files, directories and symlinks only, and the "
            f"audit never opens such a node; move it out of {root}, then audit again"
        )


class Materializer:
    """Shows crash states at ``target``, one at a time, incrementally.

    Only the entries that differ from the previous state are written; an entry a check
    changed (its inode, size or times moved) is rewritten, so a check may modify the
    tree freely. Every name is reached from a descriptor of its directory with
    ``O_NOFOLLOW`` (``openat`` and friends): a symlink a check puts at the root or
    anywhere in the state is removed or replaced, never written through.
    """

    def __init__(self, target: Path) -> None:
        self.target = target
        self._shown: dict[str, tuple[str, Data, _Key]] = {}
        self.written = 0
        """Bytes written so far (the cost of materialising)."""

    def show(self, flat: _Flat, times: Mapping[str, int] | None = None) -> None:
        """Make ``target`` hold exactly ``flat`` (paths relative to it, parents first),
        each entry's mtime as ``times`` says (ns; one it does not name as written)."""
        want = {path: (kind, payload) for path, kind, payload in flat}
        detach_mounts(self.target)  # one a check left: never emptied through
        dirs = {"": _open_root(self.target)}
        try:
            self._prune(dirs[""], "", want)
            for path, kind, payload in flat:
                if path in self._shown:
                    continue
                parent, _, name = path.rpartition("/")
                at = dirs.get(parent)
                if at is None:
                    at = dirs[parent] = self._open_dir(dirs, parent)
                if kind == "dir":
                    os.mkdir(name, dir_fd=at)
                    key = _key(os.lstat(name, dir_fd=at))
                elif kind == "symlink":
                    os.symlink(text(payload), name, dir_fd=at)
                    key = _key(os.lstat(name, dir_fd=at))
                else:
                    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
                    with open(os.open(name, flags, 0o644, dir_fd=at), "wb") as f:
                        write_to(f, payload)  # a sparse file's holes as holes
                        key = _key(os.fstat(f.fileno()))
                    self.written += stored(payload)
                self._shown[path] = (kind, payload if kind != "dir" else b"", key)
        finally:
            for fd in dirs.values():
                os.close(fd)
        if times:
            self._stamp(times)

    def _stamp(self, times: Mapping[str, int]) -> None:
        """Set each entry's times (an entry's own: its directory's mtime is unchanged)."""
        for rel, _, at, name in walk_tree(self.target):
            ns = times.get(rel)
            shown = self._shown.get(rel)
            if ns is None or shown is None:
                continue
            os.utime(name, ns=(ns, ns), dir_fd=at, follow_symlinks=False)
            self._shown[rel] = (shown[0], shown[1], _key(os.lstat(name, dir_fd=at)))

    def _open_dir(self, dirs: dict[str, int], rel: str) -> int:
        parent, _, name = rel.rpartition("/")
        at = dirs.get(parent)
        if at is None:
            at = dirs[parent] = self._open_dir(dirs, parent)
        return os.open(name, _DIR, dir_fd=at)

    def _prune(self, fd: int, rel: str, want: dict[str, tuple[str, Data]]) -> None:
        for name in os.listdir(fd):
            path = f"{rel}{name}"
            try:
                st = os.lstat(name, dir_fd=fd)
            except FileNotFoundError:
                continue
            kind = _kind(st)
            shown = self._shown.get(path)
            wanted = want.get(path)
            keep = (
                shown is not None
                and wanted is not None
                and shown[0] == kind == wanted[0]
                and (kind == "dir" or shown[2] == _key(st))
                and (shown[1] is wanted[1] or shown[1] == wanted[1])
            )
            if keep and kind == "dir":
                sub = os.open(name, _DIR, dir_fd=fd)
                try:
                    self._prune(sub, path + "/", want)
                finally:
                    os.close(sub)
                continue
            if keep:
                continue
            if kind == "dir":
                shutil.rmtree(name, dir_fd=fd)
            else:
                os.unlink(name, dir_fd=fd)
            # what this object showed at or below ``path`` is gone (a directory a check
            # turned into a file took its files with it: issue 29.13)
            for gone in [p for p in self._shown if p == path or p.startswith(path + "/")]:
                del self._shown[gone]
        # a name this object showed that is no longer on disk must be recreated
        for path in [p for p in self._shown if p.startswith(rel) and "/" not in p[len(rel) :]]:
            try:
                os.lstat(path[len(rel) :], dir_fd=fd)
            except FileNotFoundError:
                for gone in [p for p in self._shown if p == path or p.startswith(path + "/")]:
                    del self._shown[gone]


class Interrupted(KeyboardInterrupt):
    """SIGTERM (or SIGHUP) arrived during an audit: the original directory is put back."""


def copy_original(original: Path, path: Path) -> None:
    """Copy the parked ``original`` to ``path`` for the workload to start from; a disk too
    full for it is an :class:`AuditError` that says how much room the copy needs (s15
    attack: shutil.Error's raw list of tuples was the message)."""
    try:
        shutil.copytree(original, path, symlinks=True, copy_function=copy_sparse)
    except OSError as exc:
        said = exc.args[0] if isinstance(exc, shutil.Error) and exc.args else [exc]
        if not any(f"[Errno {errno.ENOSPC}]" in str(e) for e in said) and not (
            exc.errno == errno.ENOSPC
        ):
            raise
        need = sum(st.st_blocks * 512 for _, st, _, _ in walk_tree(original))
        raise AuditError(
            f"no space left on the filesystem of {path} for the audit's working copy of the "
            f"directory (it is copied for the workload to start from): it needs about {need} "
            f"bytes free beside the directory itself; make room, or audit a smaller "
            f"directory. Nothing was judged, and {path} is as it was"
        ) from None


def remove(path: Path) -> None:
    """Remove whatever is at ``path`` (a tree, a file, a symlink), if anything; a mount
    left below it is detached first, never descended into."""
    if path.is_dir() and not path.is_symlink():
        detach_mounts(path)
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def _park(root: Path, aside: Path) -> None:
    try:
        os.rename(root, aside)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        raise AuditError(
            f"{root} cannot be moved aside within its filesystem (the kernel says EXDEV, a "
            f"cross-device rename): on overlayfs (a container image) a directory of a lower "
            f"layer cannot be renamed, nor can a directory across a mount. Audit a copy "
            f"in a writable directory (cp -a {root} ckpts-copy; --root ckpts-copy); "
            f"nothing was judged, and {root} is as it was"
        ) from None


@contextlib.contextmanager
def set_aside(root: Path) -> Iterator[Path | None]:
    """Lock the name ``root``, park the directory there (if any) in the audits' private
    directory and put it back afterwards, also after Ctrl-C, SIGTERM or SIGHUP (the
    signals raise :class:`Interrupted` in the main thread).

    Yields where the original is (None if ``root`` did not exist). What the audit leaves
    at ``root`` is removed first.
    """
    with locked(root):
        aside, absent = aside_path(root), absent_path(root)
        if os.path.lexists(aside):
            raise AuditError(
                f"{aside} exists: an earlier audit of {root} was killed before it could put "
                f"the original back, so {root} holds a crash state it showed there, not "
                f"your directory. Check {aside}, remove the crash state at {root}, then "
                f"move it back to {root} (or remove it) and audit again"
            )
        if os.path.lexists(absent):
            raise AuditError(
                f"an earlier audit of {root}, which did not exist then, was killed before it "
                f"could remove the crash state it showed there: what is at {root} is that "
                f"crash state, not yours. Remove it (check it first) and {absent}, then "
                f"audit again"
            )
        if is_mount_point(root):
            raise AuditError(
                f"{root} is a mount point: the audit moves the directory aside and shows each "
                f"crash state at its path, which it cannot do to a mount point; audit a "
                f"directory inside it instead (--root {root / 'ckpts'}, say)"
            )
        previous: dict[signal.Signals, Any] = {}

        def interrupted(signum: int, frame: FrameType | None) -> None:
            raise Interrupted(f"signal {signum}")

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGHUP):
                previous[sig] = signal.signal(sig, interrupted)
        held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
        signal.pthread_sigmask(signal.SIG_BLOCK, held)  # no interrupt until it is parked
        moved = marked = ready = False
        try:
            if os.path.lexists(root):
                _park(root, aside)
                moved = True
            else:  # a killed audit's crash state is then told from a directory of yours
                os.close(os.open(absent, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
                marked = True
            ready = True  # from here on, what is at root is the audit's
            signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
            yield aside if moved else None
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
            try:
                if ready:
                    remove(root)
                if marked:  # only once nothing of the audit's is left at root
                    os.unlink(absent)
            finally:
                if moved:
                    os.rename(aside, root)
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
