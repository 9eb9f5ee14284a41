"""The lock files of a root: ``flock(2)`` on files the library names.

* The root lock (``.atomic_ckpt.tmp-root.lock``) serializes promotion, repair
  and deletion within a root. Its holder removes the file (while still holding
  it) when done, so a root at rest holds nothing but checkpoints; a file left by
  a killed holder is taken and removed by the next one.
* A writer holds ``N.tmp-<token>.lock`` (``.tmp-<prefix>N.<token>.lock`` in a root
  with a prefix) for the whole of its save and removes it
  (while still holding it) when done; ``clean()`` claims a token's lock before it
  touches that token's entries, so a live save is never removed.

Removing a lock file that another process waits on would let two processes hold
"the" lock, were it not for the check every acquisition makes below. (Versions that
took the root lock with ``filelock`` did not make it: do not run one against the same
root at the same time as this one.)

A lock held by a dead process is free: the kernel drops flock locks with the
last descriptor. Each acquisition opens its own descriptor, so threads of one
process exclude each other as processes do. Any lock file can be
removed by its holder, so every acquisition checks, once it holds the lock,
that the name still leads to the file it locked (else it lost a race with a
remover and tries again, or reports the lock as taken). Opened with
``O_NOFOLLOW``: a lock file planted as a symlink is refused, never followed
(the class of bug of filelock's CVE-2025-68146 and CVE-2026-22701). This is
filelock's Unix mechanism without its per-call bookkeeping, which cost about
0.1 ms per acquisition here, a third of a small commit's fixed cost.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["Lock", "acquire", "create", "is_held", "lock_directory", "try_acquire", "writing_in"]

_FLAGS = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
_BUSY = frozenset({errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES})
_POLL = (0.001, 0.05)
"""First and longest sleep between tries of a contended lock (seconds)."""

log = logging.getLogger(__name__)


class Lock:
    """A held lock: an open descriptor of ``path`` with an exclusive flock on it."""

    __slots__ = ("_fd", "_pid", "path")

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd
        self._pid = os.getpid()

    def release(self, *, remove: bool = False) -> None:
        """Release the lock; with ``remove``, first unlink its file (while still holding it).

        The descriptor is closed even if the unlink fails: a lock is never leaked.
        """
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if remove and _still_named(self.path, fd):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
        finally:
            _unlock(fd, self._pid)

    def __del__(self) -> None:
        # A lock dropped without release() (an error path that lost it) still frees
        # its descriptor, and with it the flock, once the object is collected.
        fd, self._fd = getattr(self, "_fd", None), None
        if fd is not None:
            with contextlib.suppress(OSError):
                _unlock(fd, self._pid)

    def __repr__(self) -> str:
        return f"Lock({str(self.path)!r}, held={self._fd is not None})"


def _unlock(fd: int, owner: int) -> None:
    """Drop the flock and close ``fd``.

    The flock belongs to the open file description, which a child forked while
    the lock was held shares: closing our descriptor alone would leave the lock
    held for as long as the child lives. So the owner unlocks explicitly; a
    forked child only closes its copy (unlocking there would free the parent's).
    """
    try:
        if os.getpid() == owner:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _still_named(path: Path, fd: int) -> bool:
    try:
        return os.path.samestat(os.stat(path, follow_symlinks=False), os.fstat(fd))
    except FileNotFoundError:
        return False


def _lock_fd(path: Path, flags: int) -> Lock | None:
    """Open ``path`` and take its flock without waiting; None if someone holds it or the
    file vanished under us. Raises for any other error (permissions, a symlink)."""
    fd = os.open(path, flags, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        named = _still_named(path, fd)
    except OSError as exc:
        os.close(fd)
        if exc.errno in _BUSY:
            return None
        raise
    except BaseException:  # an interrupt (Ctrl-C, SystemExit): no flock outlives it
        if flags & os.O_EXCL:  # the file is new and ours: nobody else can be using it
            with contextlib.suppress(OSError):
                os.unlink(path)
        os.close(fd)
        raise
    if not named:  # removed (or replaced) by its holder before we locked it
        os.close(fd)
        return None
    return Lock(path, fd)


def acquire(path: Path, timeout: float) -> Lock:
    """Take the lock ``path`` (creating its file if missing), waiting up to ``timeout``
    seconds (negative: forever). Raises TimeoutError when the wait runs out."""
    deadline = None if timeout < 0 else time.monotonic() + timeout
    pause = _POLL[0]
    while True:
        lock = _lock_fd(path, _FLAGS | os.O_CREAT)
        if lock is not None:
            return lock
        if deadline is not None and time.monotonic() + pause > deadline:
            raise TimeoutError(errno.ETIMEDOUT, f"timed out waiting for {path}")
        time.sleep(pause)
        pause = min(pause * 2, _POLL[1])


def try_acquire(path: Path) -> Lock | None:
    """Take ``path`` if it is free (creating its file if missing); None if someone holds it."""
    return _lock_fd(path, _FLAGS | os.O_CREAT)


def create(path: Path) -> Lock | None:
    """Create the new lock file ``path`` and hold it; None if the name is taken or a
    remover won the race (the caller picks a new name)."""
    try:
        return _lock_fd(path, _FLAGS | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return None


def is_held(path: Path) -> bool:
    """Does a live process hold the lock file ``path``? False if it does not exist.

    Opens read-only and creates nothing, so it works on a read-only root.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError:
        return True  # cannot tell: assume it is live
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_CLOEXEC
_FOREIGN_WAIT = 10.0
"""How long (seconds) :func:`writing_in` waits for an exclusive flock on its directory to
go before it writes without its own: longer than a clean holds it, unless it is someone
else's (``flock ckpts/ python train.py``), which would otherwise hang every save."""
_foreign: set[tuple[int, int]] = set()
"""The directories (device, inode) found locked by someone else: no more waits there."""


@contextlib.contextmanager
def writing_in(directory: Path) -> Iterator[None]:
    """Hold a shared flock on ``directory`` itself while a one-file write's temporary
    lives in it, so that :func:`lock_directory` (what ``clean_temporaries`` takes before it
    removes anything) sees a live write, in any process or thread. Waits while a clean
    runs, up to :data:`_FOREIGN_WAIT` seconds: an exclusive flock held longer is another
    program's (``flock(1)`` on the directory), and the write goes ahead without the lock,
    with a warning, as it did before this lock existed. Best effort: where a directory
    cannot be opened or flocked, nothing is held."""
    try:
        fd = os.open(directory, _DIR_FLAGS)
    except OSError:
        fd = -1
    pid = os.getpid()
    held = False
    try:
        if fd >= 0:
            # Where it cannot be locked (some network filesystems), nothing is held.
            with contextlib.suppress(OSError):
                held = _share(fd, directory)
        yield
    finally:
        if held:
            _unlock(fd, pid)
        elif fd >= 0:  # no lock to drop: where flock fails, LOCK_UN fails as well
            os.close(fd)


def _share(fd: int, directory: Path) -> bool:
    """Take the shared flock on ``fd``, never waiting forever (see :func:`writing_in`);
    False when it went ahead without it.

    Going ahead without it is safe against a clean in progress: a clean removes only what
    it listed just after taking its lock, before this write's temporary existed."""
    st = os.fstat(fd)
    key = (st.st_dev, st.st_ino)
    # Where another program's lock was seen, only long enough for a clean to list.
    deadline = time.monotonic() + (_POLL[1] * 2 if key in _foreign else _FOREIGN_WAIT)
    pause = _POLL[0]
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno not in _BUSY:
                raise
        if time.monotonic() + pause > deadline:
            break
        time.sleep(pause)
        pause = min(pause * 2, _POLL[1])
    if key not in _foreign:
        _foreign.add(key)
        log.warning(
            "%s has been locked exclusively (flock) by another program for over %g s (a "
            "`flock %s <command>`?): writing there without atomic_ckpt's directory lock, so "
            "clean_temporaries elsewhere could remove a write in progress; have that "
            "program lock a file, not the directory",
            directory,
            _FOREIGN_WAIT,
            directory,
        )
    return False


def lock_directory(directory: Path) -> Lock | None:
    """An exclusive flock on ``directory`` itself, without waiting: None while a
    :func:`writing_in` block holds it (a write in progress there). Raises OSError when
    the directory cannot be locked at all (the caller cannot tell then)."""
    fd = os.open(directory, _DIR_FLAGS)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in _BUSY:
            return None
        raise
    return Lock(directory, fd)
