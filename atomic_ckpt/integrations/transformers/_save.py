"""Save: one commit of a step, multi-rank when several processes run, else local."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from atomic_ckpt import CheckpointDir, DistributedCommitError, StepConflictError
from atomic_ckpt._core.l2_syscalls import fs as _fs
from atomic_ckpt._core.l2_syscalls.errnos import SYMLINK_REFUSED
from atomic_ckpt.distributed import distributed_commit
from atomic_ckpt.integrations.transformers._resume import _distributed

_OPTION = "pass replace_unusable=True"

log = logging.getLogger(__package__ or __name__)


@contextlib.contextmanager
def _commit(
    ckpts: CheckpointDir,
    step: int,
    metadata: dict[str, Any],
    *,
    dedup: bool = False,
    replace_unusable: bool = False,
) -> Iterator[Path]:
    """One commit of ``step``: multi-rank when several processes run, else local;
    ``dedup`` and ``replace_unusable`` as for ``ckpts.commit``. A refusal to replace an
    unusable checkpoint names the option where a Trainer user gives it (the constructor)."""
    options: dict[str, Any] = {"metadata": metadata, "dedup": dedup}
    if replace_unusable:
        options["replace_unusable"] = True
    try:
        if _distributed():
            with distributed_commit(ckpts, step, **options) as path:
                yield path
        else:
            with ckpts.commit(step, **options) as path:
                yield path
    except (StepConflictError, DistributedCommitError) as exc:
        if _OPTION not in str(exc):
            raise
        trainer = str(exc).replace(
            _OPTION, "pass AtomicTrainer(..., replace_unusable=True) (or the mixin's option)"
        )
        reworded = (
            StepConflictError(trainer, path=exc.path, step=exc.step)
            if isinstance(exc, StepConflictError)
            else DistributedCommitError(trainer, path=exc.path, step=exc.step, ranks=exc.ranks)
        )
        raise reworded from exc


def symlinks_refused(exc: OSError) -> bool:
    """Whether ``exc`` (wrapped or not) says the filesystem makes no symlinks."""
    cause = exc.__cause__ if isinstance(exc.__cause__, OSError) else exc
    return cause.errno in SYMLINK_REFUSED


def make_inner(staging: Path, folder: str) -> None:
    """``staging/<folder>``, where Trainer writes ``<run dir>/checkpoint-N/...``: a link to the
    staging directory itself, so every rank's files land at their final paths; where the
    filesystem makes no symlinks, a real directory whose entries :func:`lift_inner` moves
    up once every rank has written. Each rank makes it (or finds it) before it writes."""
    inner = staging / folder
    try:
        _fs.symlink(".", inner)
    except FileExistsError:
        pass
    except OSError as exc:
        if not symlinks_refused(exc):
            raise
        with contextlib.suppress(FileExistsError):
            os.mkdir(inner)
    if not (inner.is_symlink() or inner.is_dir()):
        raise FileExistsError(f"{inner} is not the link this save made")


def lift_inner(staging: Path, folder: str) -> None:
    """Rank 0, once every rank has written: ``staging/<folder>`` gone, and where it was a
    real directory (no symlinks), each entry renamed up into ``staging`` first (before the
    commit flushes the staging directory, so the renames are made durable with it)."""
    inner = staging / folder
    if inner.is_symlink():
        os.unlink(inner)
        return
    for name in sorted(os.listdir(inner)):
        _fs.rename(inner / name, staging / name)
    os.rmdir(inner)
