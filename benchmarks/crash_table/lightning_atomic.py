"""Row "Lightning ModelCheckpoint + ckpt_path="last"", with atomic_ckpt: the same
``ModelCheckpoint`` with the ``AtomicCheckpointIO`` plugin (``--async``:
``async_save=True``), and the same resume. See ``_lightning``."""

from __future__ import annotations

import sys
from pathlib import Path

import _common
import _lightning
from atomic_ckpt.integrations.lightning import AtomicCheckpointIO


def workload(root: Path, async_: bool = False) -> None:
    """Three saves through AtomicCheckpointIO."""
    _lightning.workload(root, lambda: [AtomicCheckpointIO(async_save=async_)])


def check(root: Path) -> str:
    """``fit(ckpt_path="last")`` with AtomicCheckpointIO; judge what it restored."""
    return _lightning.check(root, [AtomicCheckpointIO()])


if __name__ == "__main__":
    sys.exit(_common.main(workload, check, has_async=True))
