"""Crash-safe, atomic and durable commits of whole checkpoint directories.

::

    from atomic_ckpt import CheckpointDir

    ckpts = CheckpointDir("checkpoints")
    with ckpts.commit(step) as path:       # path is a staging dir: .tmp-N.<uuid>/
        save_everything_into(path)         # any save function
    # here checkpoints/<step>/ is complete and durable, or untouched on error
    last = ckpts.latest()                  # newest *complete* checkpoint, or None
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, SupportsIndex

from ._async import AsyncCommitter
from ._checkpoint import CheckpointDir
from ._commit import Commit
from ._errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointTimeoutError,
    CommitStateError,
    CommitterClosedError,
    DistributedCommitError,
    DistributedNotInitializedError,
    InvalidRootError,
    InvalidStepError,
    ManifestError,
    NotDurableError,
    RootNotWritableError,
    StagingLostError,
    StepConflictError,
    UnmarkedCheckpointsError,
    VerificationError,
)
from ._manifest import FileEntry, Manifest
from ._named import NamedCheckpoint
from ._names import BEST_LINK, MARKER, TMP_INFIX, parse_step
from ._onefile import (
    atomic_write,
    clean_temporaries,
    commit_directory,
    remove_directory,
    remove_file,
    replace_symlink,
    temp_name,
    write_bytes_atomic,
)
from ._read import Checkpoint, Entry
from ._retention import RetentionPolicy
from ._sync import NoSync, SyncPolicy
from ._version import __version__


@contextlib.contextmanager
def commit(
    root: str | os.PathLike[str],
    step: SupportsIndex,
    *,
    prefix: str = "",
    durable: bool = True,
    metadata: Mapping[str, Any] | None = None,
) -> Iterator[Path]:
    """``CheckpointDir(root, ...).commit(step)`` in one call."""
    with CheckpointDir(root, prefix=prefix, durable=durable).commit(step, metadata=metadata) as p:
        yield p


def latest(root: str | os.PathLike[str], *, prefix: str = "") -> Checkpoint | None:
    """The newest complete checkpoint under ``root``, or None."""
    return CheckpointDir(root, prefix=prefix).latest()


__all__ = [
    "BEST_LINK",
    "MARKER",
    "TMP_INFIX",
    "AsyncCommitter",
    "Checkpoint",
    "CheckpointDir",
    "CheckpointError",
    "CheckpointNotFoundError",
    "CheckpointTimeoutError",
    "Commit",
    "CommitStateError",
    "CommitterClosedError",
    "DistributedCommitError",
    "DistributedNotInitializedError",
    "Entry",
    "FileEntry",
    "InvalidRootError",
    "InvalidStepError",
    "Manifest",
    "ManifestError",
    "NamedCheckpoint",
    "NoSync",
    "NotDurableError",
    "RetentionPolicy",
    "RootNotWritableError",
    "StagingLostError",
    "StepConflictError",
    "SyncPolicy",
    "UnmarkedCheckpointsError",
    "VerificationError",
    "__version__",
    "atomic_write",
    "clean_temporaries",
    "commit",
    "commit_directory",
    "latest",
    "parse_step",
    "remove_directory",
    "remove_file",
    "replace_symlink",
    "temp_name",
    "write_bytes_atomic",
]
