"""Row "Lightning trainer.save_checkpoint(path) by hand", with atomic_ckpt: the
``AtomicCheckpointIO`` plugin (``--async``: ``async_save=True``, which still writes a save
by hand before it returns). See ``_lightning_final``."""

from __future__ import annotations

import sys
from pathlib import Path

import _common
import _lightning_final
from atomic_ckpt.integrations.lightning import AtomicCheckpointIO


def workload(root: Path, async_: bool = False) -> None:
    """Three saves by hand through AtomicCheckpointIO."""
    _lightning_final.workload(root, lambda: [AtomicCheckpointIO(async_save=async_)])


def check(root: Path) -> str:
    """Load the final model; judge it."""
    return _lightning_final.check(root)


if __name__ == "__main__":
    sys.exit(_common.main(workload, check, has_async=True))
