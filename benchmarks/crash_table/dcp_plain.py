"""Row "torch DCP FileSystemWriter", plain: ``dcp.save`` with a ``FileSystemWriter`` on
``ckpt/<step>/`` (its own fsyncs on, the default); resume from the highest numbered
directory with ``dcp.load``. See ``_dcp``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp

import _common
import _dcp
import _nets


def workload(root: Path) -> None:
    """Three saves by FileSystemWriter straight into ``ckpt/<step>/``."""

    def save(step: int, state: dict[str, Any]) -> None:
        writer = dcp.FileSystemWriter(root / "ckpt" / str(step))
        dcp.save(state, storage_writer=writer, no_dist=True)

    _dcp.workload(root, save)


def check(root: Path) -> str:
    """Resume from the highest numbered directory of ``ckpt/``; judge what it holds."""
    steps = [int(p.name) for p in (root / "ckpt").glob("*") if p.name.isdigit() and p.is_dir()]
    if not steps:
        return _common.judge(root, None, "ckpt/")
    directory = root / "ckpt" / str(max(steps))
    return _nets.judged_load(root, f"ckpt/{directory.name}/", lambda: _dcp.load(directory))


if __name__ == "__main__":
    sys.exit(_common.main(workload, check))
