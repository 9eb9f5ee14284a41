"""Row "Lightning ModelCheckpoint + ckpt_path="last"", plain: Lightning's own
``TorchCheckpointIO`` writes each ``.ckpt`` in place. See ``_lightning``."""

from __future__ import annotations

import sys
from pathlib import Path

import _common
import _lightning


def workload(root: Path) -> None:
    """Three saves through Lightning's default CheckpointIO."""
    _lightning.workload(root, list)


def check(root: Path) -> str:
    """``fit(ckpt_path="last")``; judge what it restored."""
    return _lightning.check(root, [])


if __name__ == "__main__":
    sys.exit(_common.main(workload, check))
