"""Row "torch DCP FileSystemWriter", with atomic_ckpt: ``dcp.save`` (``--async``:
``dcp.async_save(...).result()``) with an ``AtomicWriter``; resume from ``latest()`` with
plain ``dcp.load``. See ``_dcp``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp

import _common
import _dcp
import _nets
from atomic_ckpt import CheckpointDir
from atomic_ckpt.dcp import AtomicWriter


def workload(root: Path, async_: bool = False) -> None:
    """Three saves, each committed as ``ckpt/<step>/`` by AtomicWriter."""
    ckpts = CheckpointDir(root / "ckpt")

    def save(step: int, state: dict[str, Any]) -> None:
        writer = AtomicWriter(ckpts, step)
        if async_:
            dcp.async_save(state, storage_writer=writer, no_dist=True).result()
        else:
            dcp.save(state, storage_writer=writer, no_dist=True)

    _dcp.workload(root, save)


def check(root: Path) -> str:
    """Resume from the newest complete checkpoint with plain ``dcp.load``; judge it."""
    try:
        found = CheckpointDir(root / "ckpt").resume_point()
    except Exception as exc:
        raise _common.Violation(f"resume_point() raised {type(exc).__name__}: {exc}") from exc
    if found is None:
        return _common.judge(root, None, "ckpt/")
    where = f"ckpt/{found.path.name}/"
    return _nets.judged_load(root, where, lambda: _dcp.load(found.path))


if __name__ == "__main__":
    sys.exit(_common.main(workload, check, has_async=True))
