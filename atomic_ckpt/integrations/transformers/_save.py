"""Save: one commit of a step, multi-rank when several processes run, else local."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from atomic_ckpt import CheckpointDir, DistributedCommitError, StepConflictError
from atomic_ckpt.distributed import distributed_commit
from atomic_ckpt.integrations.transformers._resume import _distributed

_OPTION = "pass replace_unusable=True"


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
