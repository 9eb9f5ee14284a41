"""Row "Lightning trainer.save_checkpoint(path) by hand", plain: Lightning's own
``TorchCheckpointIO`` writes the file. See ``_lightning_final``."""

from __future__ import annotations

import sys
from pathlib import Path

import _common
import _lightning_final


def workload(root: Path) -> None:
    """Three saves by hand through Lightning's default CheckpointIO."""
    _lightning_final.workload(root, list)


def check(root: Path) -> str:
    """Load the final model; judge it."""
    return _lightning_final.check(root)


if __name__ == "__main__":
    sys.exit(_common.main(workload, check))
