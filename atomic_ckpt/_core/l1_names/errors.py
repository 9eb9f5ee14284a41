"""The error hierarchy: one base class, each subclass also the builtin a caller catches.

Every error carries the path or step it is about and pickles (so it survives a
``multiprocessing`` or ``torch.distributed`` boundary with its attributes).
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path
from typing import Any


class CheckpointError(Exception):
    """Base class of every error raised by atomic_ckpt."""

    def __init__(
        self, message: str, *, path: str | Path | None = None, step: int | None = None
    ) -> None:
        super().__init__(message)
        self.path = Path(path) if path is not None else None
        self.step = step

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""

    def __reduce__(self) -> tuple[Any, ...]:
        # OSError and friends pickle by their args only; keep path/step as well.
        return (_rebuild, (type(self), str(self), self.path, self.step), self.__dict__)


def _rebuild(
    cls: type[CheckpointError], message: str, path: Path | None, step: int | None
) -> CheckpointError:
    return cls(message, path=path, step=step)


class InvalidStepError(CheckpointError, ValueError):
    """A step that is not a non-negative integer."""


class InvalidRootError(CheckpointError, NotADirectoryError):
    """The checkpoint root exists but is not a directory."""


class RootNotWritableError(CheckpointError, PermissionError):
    """The root (or its parent) cannot be written: permissions or a read-only filesystem."""


class StepConflictError(CheckpointError, FileExistsError):
    """The step's name is taken by something that is not a checkpoint directory."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """No complete checkpoint exists for the requested step (absent or unmarked)."""


class StagingLostError(CheckpointError, FileNotFoundError):
    """The staging directory disappeared or was replaced during the save."""


class ManifestError(CheckpointError, ValueError):
    """A marker that is not a valid manifest, or a manifest with unsafe paths; when
    committing, an entry no manifest can record (a FIFO, socket or device, a name that
    is not valid UTF-8), or a manifest naming a checksum algorithm this Python lacks."""


class NewerFormatError(ManifestError):
    """A marker in a format version newer than this atomic_ckpt reads: written by a
    newer release, and likely complete (upgrade to read it)."""


class MarkerIsDirectoryError(ManifestError, IsADirectoryError):
    """A directory, not a file, where a checkpoint's marker goes (``path``): the step is
    unusable until it is moved out. Nothing in it is ever deleted unasked."""


class VerificationError(CheckpointError, OSError):
    """A checkpoint's files do not match its manifest (missing, wrong size or checksum).

    ``problems`` lists every mismatch found, one line each.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | Path | None = None,
        step: int | None = None,
        problems: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message, path=path, step=step)
        self.problems = problems


class NotDurableError(CheckpointError, OSError):
    """The checkpoint was promoted, but making the promotion durable failed."""


class _ErrnoError(CheckpointError, OSError):
    """A CheckpointError that is an OSError with an ``errno`` (``code``, else the class's
    default), its ``strerror`` and ``filename``; pickles with all three."""

    _default_code = 0

    def __init__(
        self,
        message: str,
        *,
        path: str | Path | None = None,
        step: int | None = None,
        code: int | None = None,
    ) -> None:
        super().__init__(message, path=path, step=step)
        self.errno = self._default_code if code is None else code
        self.strerror = os.strerror(self.errno)
        self.filename = None if path is None else str(path)

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_errno,
            (type(self), str(self), self.path, self.step, self.errno),
            self.__dict__,
        )


def _rebuild_errno(
    cls: type[_ErrnoError], message: str, path: Path | None, step: int | None, code: int
) -> _ErrnoError:
    return cls(message, path=path, step=step, code=code)


class DiskFullError(_ErrnoError):
    """The disk (or the quota) filled up during a commit: ``errno`` is the original
    ``ENOSPC`` (or ``EDQUOT``), the original error its cause. The commit was aborted and
    its staging directory removed; every checkpoint committed before is untouched. Free
    space (``prune``, ``clean()``, or a bigger disk), then save again."""

    _default_code = errno.ENOSPC


class SymlinksUnsupportedError(_ErrnoError):
    """The filesystem of the root makes no symlinks (vfat, exFAT, some SMB mounts), and
    what was asked for is one (an alias): ``errno`` is the refusal's (EPERM, EOPNOTSUPP...),
    the original error its cause. Commit there without ``aliases=``, or put the root on a
    filesystem with symlinks."""

    _default_code = errno.EOPNOTSUPP


class InsideCheckpointError(CheckpointError, ValueError):
    """A save aimed at a committed checkpoint (``path``), or at a directory inside one,
    which a save would change in place. A committed checkpoint is never changed in place:
    save to another directory, or make the change a new commit of that step
    (:meth:`CheckpointDir.amend <atomic_ckpt.CheckpointDir.amend>`)."""


class CheckpointTimeoutError(CheckpointError, TimeoutError):
    """Waiting for a lock of the checkpoint root timed out."""


class UnusableCheckpointsError(CheckpointError, FileExistsError):
    """A resume found step directories it cannot use and no checkpoint to resume from.

    Each is there but unusable: no marker, a marker this version cannot read (a newer
    format version, a non-empty legacy marker), or files that do not verify (with
    ``verify=True``). Starting from scratch there would train over (and soon replace)
    them. ``paths`` lists them; ``problems`` says why each cannot be used, one line each.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | Path | None = None,
        step: int | None = None,
        paths: tuple[Path, ...] = (),
        problems: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message, path=path, step=step)
        self.paths = paths
        self.problems = problems


class NewerCheckpointsError(UnusableCheckpointsError):
    """A resume found checkpoints newer than the one it would resume from, in a marker
    format newer than this atomic_ckpt reads (a newer release wrote them).

    Resuming from the older one would train over them and, at their step, replace
    them. Upgrade atomic_ckpt, or move them away. ``paths`` lists them; ``problems``
    says what each is.
    """


class UnmarkedCheckpointsError(UnusableCheckpointsError):
    """A resume found step directories without a marker and no complete checkpoint.

    Starting from scratch there would train over (and soon replace) checkpoints
    written before atomic_ckpt. ``paths`` lists them.
    """


class CommitStateError(CheckpointError, RuntimeError):
    """A commit handle used when it cannot be: already published or aborted, or from a
    process other than the one that began it (a child forked inside the ``with`` block)."""


class CommitterClosedError(CheckpointError, RuntimeError):
    """An :class:`~atomic_ckpt.AsyncCommitter` was used after ``close()``."""


class DistributedNotInitializedError(CheckpointError, RuntimeError):
    """A multi-rank call was made before ``torch.distributed.init_process_group()``."""


class DistributedCommitError(CheckpointError, RuntimeError):
    """A multi-rank commit failed: a rank raised, crashed or timed out.

    Raised on every rank that is still alive. ``ranks`` lists the ranks that
    reported a failure (empty when the failure was losing contact with them).
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | Path | None = None,
        step: int | None = None,
        ranks: tuple[int, ...] = (),
    ) -> None:
        super().__init__(message, path=path, step=step)
        self.ranks = ranks


_NOT_WRITABLE = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})
_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


_FULL_TEXT = re.compile(r"no space left on device|os error 28\b", re.IGNORECASE)
_QUOTA_TEXT = re.compile(r"disk quota exceeded|os error 122\b", re.IGNORECASE)

FULL_MARGIN = 1 << 20
"""Bytes free below which a filesystem counts as full for :func:`looks_full`."""


def looks_full(exc: BaseException, where: Path) -> int | None:
    """ENOSPC (or EDQUOT) if ``exc``, a serializer's own error rather than an OSError, was
    the disk filling up: its message says so (a ``SafetensorError``: "os error 28"), or it
    is a RuntimeError (torch's C++ writer: ``[enforce fail at inline_container.cc]
    unexpected pos``, which names no errno) and the filesystem holding ``where`` has less
    than :data:`FULL_MARGIN` bytes left for this user (check it before what the failed
    write left is removed); None otherwise, and for an OSError (its errno says it)."""
    if isinstance(exc, OSError | CheckpointError) or not isinstance(exc, Exception):
        return None  # (the library's own errors say what they are)
    text = str(exc)
    if _QUOTA_TEXT.search(text):
        return errno.EDQUOT
    if _FULL_TEXT.search(text):
        return errno.ENOSPC
    if not isinstance(exc, RuntimeError):
        return None
    try:
        st = os.statvfs(where)
    except (OSError, AttributeError):  # gone, or no statvfs (Windows): cannot tell
        return None
    return errno.ENOSPC if st.f_bavail * st.f_frsize < FULL_MARGIN else None


def disk_full(
    exc: BaseException, root: Path, what: str = "the commit", *, code: int | None = None
) -> DiskFullError | None:
    """The :class:`DiskFullError` to raise for ``exc`` (from ``exc``) if it says the disk
    or the quota holding ``root`` is full, met during ``what`` (``"the commit of step
    5"``), or ``code`` (:func:`looks_full`'s verdict on a serializer's error) says so;
    None for any other error (a DiskFullError already made among them)."""
    if isinstance(exc, DiskFullError):
        return None
    if code is None:
        if not isinstance(exc, OSError) or exc.errno not in _FULL:
            return None
        code = exc.errno
    why = "disk quota exceeded" if code == errno.EDQUOT else "no space left on the device"
    return DiskFullError(
        f"the disk holding checkpoint root {root} is full ({why}): {what} was given up and "
        "what it wrote removed; the checkpoints committed before are untouched. "
        "Free space (delete or prune old checkpoints, remove other files, or use a bigger "
        f"disk), then save again. ({exc})",
        path=root,
        code=code,
    )


def wrap_os_error(exc: OSError, root: Path) -> BaseException:
    """The error to raise for ``exc``, met while writing into the checkpoint root ``root``.

    Permission and read-only errors become :class:`RootNotWritableError`, a full disk
    :class:`DiskFullError` (each says what to do); anything else is returned unchanged.
    """
    full = disk_full(exc, root)
    if full is not None:
        return full
    if exc.errno in _NOT_WRITABLE:
        why = "the filesystem is read-only" if exc.errno == errno.EROFS else "permission denied"
        return RootNotWritableError(
            f"cannot write to checkpoint root {root}: {why}. Choose a writable "
            "directory or fix its permissions; existing checkpoints are untouched",
            path=root,
        )
    return exc
