"""Save: one commit of a step, multi-rank when several processes run, else local."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from atomic_ckpt import CheckpointDir
from atomic_ckpt.distributed import distributed_commit
from atomic_ckpt.integrations.transformers._resume import _distributed


@contextlib.contextmanager
def _commit(
    ckpts: CheckpointDir, step: int, metadata: dict[str, Any], *, dedup: bool = False
) -> Iterator[Path]:
    """One commit of ``step``: multi-rank when several processes run, else local;
    ``dedup`` as for ``ckpts.commit``."""
    if _distributed():
        with distributed_commit(ckpts, step, metadata=metadata, dedup=dedup) as path:
            yield path
    else:
        with ckpts.commit(step, metadata=metadata, dedup=dedup) as path:
            yield path
