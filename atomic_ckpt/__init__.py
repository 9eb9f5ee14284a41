"""Crash-safe, atomic and durable commits of whole checkpoint directories.

::

    from atomic_ckpt import CheckpointDir

    ckpts = CheckpointDir("checkpoints")
    with ckpts.commit(step) as path:       # path is a staging dir: N.tmp-<uuid>/
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

from atomic_ckpt._core.l1_names import public as _public
from atomic_ckpt._core.l1_names.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointTimeoutError,
    CommitStateError,
    CommitterClosedError,
    DiskFullError,
    DistributedCommitError,
    DistributedNotInitializedError,
    InsideCheckpointError,
    InvalidRootError,
    InvalidStepError,
    ManifestError,
    MarkerIsDirectoryError,
    NewerCheckpointsError,
    NewerFormatError,
    NotDurableError,
    RootNotWritableError,
    StagingLostError,
    StepConflictError,
    SymlinksUnsupportedError,
    UnmarkedCheckpointsError,
    UnusableCheckpointsError,
    VerificationError,
)
from atomic_ckpt._core.l1_names.names import BEST_LINK, MARKER, TMP_INFIX, parse_step
from atomic_ckpt._core.l2_syscalls.sync import NoSync, SyncPolicy
from atomic_ckpt._core.l3_formats.contents import FileCheck
from atomic_ckpt._core.l3_formats.manifest import FileEntry, Manifest
from atomic_ckpt._core.l3_formats.read import Checkpoint, Entry
from atomic_ckpt._core.l4_protocol.commit import Commit
from atomic_ckpt._core.l4_protocol.leftovers import clean_temporaries
from atomic_ckpt._core.l4_protocol.named import NamedCheckpoint
from atomic_ckpt._core.l4_protocol.onefile import (
    atomic_write,
    commit_directory,
    remove_directory,
    remove_file,
    replace_symlink,
    temp_name,
    write_bytes_atomic,
)
from atomic_ckpt._core.l4_protocol.retention import RetentionPolicy
from atomic_ckpt._core.l5_facade.asynchronous import AsyncCommitter
from atomic_ckpt._core.l5_facade.checkpoint import CheckpointDir
from atomic_ckpt._core.l5_facade.reading import ResumePlan, VerifiedCheckpoint
from atomic_ckpt._version import __version__


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
    "DiskFullError",
    "DistributedCommitError",
    "DistributedNotInitializedError",
    "Entry",
    "FileCheck",
    "FileEntry",
    "InsideCheckpointError",
    "InvalidRootError",
    "InvalidStepError",
    "Manifest",
    "ManifestError",
    "MarkerIsDirectoryError",
    "NamedCheckpoint",
    "NewerCheckpointsError",
    "NewerFormatError",
    "NoSync",
    "NotDurableError",
    "ResumePlan",
    "RetentionPolicy",
    "RootNotWritableError",
    "StagingLostError",
    "StepConflictError",
    "SymlinksUnsupportedError",
    "SyncPolicy",
    "UnmarkedCheckpointsError",
    "UnusableCheckpointsError",
    "VerificationError",
    "VerifiedCheckpoint",
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

_public.export(__name__, globals(), __all__)
