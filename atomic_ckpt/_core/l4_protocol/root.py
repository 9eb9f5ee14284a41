"""One checkpoint root: its settings (path, prefix, checksum, sync policy, lock
timeout, workers), its step names and its locks."""

from __future__ import annotations

import contextlib
import operator
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import SupportsIndex

from atomic_ckpt._core.l1_names.errors import (
    CheckpointNotFoundError,
    CheckpointTimeoutError,
    InvalidRootError,
    InvalidStepError,
    wrap_os_error,
)
from atomic_ckpt._core.l1_names.names import (
    ROOT_LOCK,
    TAG_STAGING,
    fits,
    hidden_tmp,
    lock_name,
    step_name,
    tmp_name,
)
from atomic_ckpt._core.l2_syscalls import fs as _fs
from atomic_ckpt._core.l2_syscalls import locks as _locks
from atomic_ckpt._core.l2_syscalls.sync import SyncPolicy


def check_step(raw: SupportsIndex) -> int:
    """``raw`` as a step: any non-negative integer (numpy and torch ones too), never a bool."""
    try:
        step = operator.index(raw)
    except TypeError:
        step = None
    # A torch bool tensor converts to 0 or 1 through __index__; a bool is no step.
    if step is None or isinstance(raw, bool) or "bool" in str(getattr(raw, "dtype", "")):
        raise InvalidStepError(
            f"step must be a non-negative int, got {type(raw).__name__} {raw!r}", step=None
        )
    if step < 0:
        raise InvalidStepError(f"step must be non-negative, got {step}", step=step)
    return step


@dataclass(frozen=True)
class Root:
    """The settings of one checkpoint root; see :class:`~atomic_ckpt.CheckpointDir`."""

    path: Path
    prefix: str
    checksum: str | None
    sync: SyncPolicy
    lock_timeout: float
    workers: int
    warned: set[Path] = field(default_factory=set, compare=False, repr=False)
    """Skipped directories already warned about (the scanner warns once per directory)."""

    def name_of(self, step: int) -> str:
        """The directory name of ``step``; InvalidStepError if no filesystem can hold it."""
        name = step_name(self.prefix, step)
        if not fits(name):
            raise InvalidStepError(
                f"step {str(step)[:20]}... is too large: its directory name would exceed "
                "the filesystem's limit of 255 bytes",
                step=step,
            )
        return name

    def tmp_name(self, name: str, token: str, tag: str = TAG_STAGING) -> str:
        """The staging (or aside) name of the entry ``name`` in this root's form: the
        design's ``N.tmp-<hex>`` in a plain root, ``.tmp-<prefix>N.<hex>`` with a prefix."""
        return tmp_name(name, token, tag, hidden=hidden_tmp(self.prefix))

    def lock_name(self, name: str, token: str) -> str:
        """The lock file beside :meth:`tmp_name` ``(name, token)``."""
        return lock_name(name, token, hidden=hidden_tmp(self.prefix))

    def wrap(self, exc: OSError) -> BaseException:
        """The error to raise for ``exc`` met while writing into this root."""
        return wrap_os_error(exc, self.path)

    def ensure(self) -> None:
        """Create the root if it is missing, durably (the parent of each new directory);
        a root someone else created gets its entry in its parent made durable, once."""
        try:
            created = _fs.makedirs(self.path)
            for directory in created:
                self.sync.root(directory.parent)
            if self.sync.durable:
                _fs.fsync_entry_once(self.path, self.sync.root, done=bool(created))
        except FileExistsError:
            raise InvalidRootError(
                f"checkpoint root {self.path} exists but is not a directory", path=self.path
            ) from None
        except NotADirectoryError:
            raise InvalidRootError(
                f"checkpoint root {self.path} cannot be created: a parent is a file",
                path=self.path,
            ) from None
        except OSError as exc:
            raise self.wrap(exc) from exc

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the root lock: promotion, repair and deletion happen under it.

        A root that does not exist holds no checkpoint to change: CheckpointNotFoundError
        (a commit creates the root first, see :meth:`ensure`).
        """
        try:
            lock = _locks.acquire(self.path / ROOT_LOCK, self.lock_timeout)
        except (FileNotFoundError, NotADirectoryError) as exc:
            if os.path.isdir(self.path):
                raise self.wrap(exc) from exc
            raise CheckpointNotFoundError(
                f"checkpoint root {self.path} does not exist, so it holds no checkpoint "
                "(it is created by the first commit)",
                path=self.path,
            ) from None
        except TimeoutError:
            raise CheckpointTimeoutError(
                f"timed out after {self.lock_timeout}s waiting for the lock of {self.path}; "
                "another process holds it (a commit, clean or prune)",
                path=self.path,
            ) from None
        except OSError as exc:
            raise self.wrap(exc) from exc
        try:
            yield
        finally:
            # Removed with its release, so that a root at rest holds only checkpoints
            # (a tool that takes every entry for one, as Accelerate's automatic
            # naming does, crashed on it). Safe: see _locks.
            lock.release(remove=True)


def resolve(root: str | os.PathLike[str]) -> Path:
    """``root`` absolute with symlinks resolved.

    fsync_dir never follows a link (O_NOFOLLOW), so a root reached through one
    (``ckpts -> /scratch/ckpts``) must be fsynced by its real path; resolving
    once also keeps one commit in one directory if the link moves.
    """
    return Path(os.path.realpath(os.fspath(root)))
