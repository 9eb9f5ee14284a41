"""Row "torch.save to the final file", with atomic_ckpt: ``torch.save`` inside
``atomic_write(ckpt/ckpt-<step>.pt)``; resume from the highest step, exactly as the plain
script does (the temporary names are hidden, so the glob never sees them)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

import _common
import _nets
from atomic_ckpt import atomic_write
from torchsave_plain import check, newest

__all__ = ["check", "newest", "workload"]


def workload(root: Path) -> None:
    """Three saves, each into a temporary file renamed over the final name."""

    def save(step: int, saved: dict[str, Any]) -> None:
        with atomic_write(root / "ckpt" / f"ckpt-{step}.pt", parents=True) as tmp:
            torch.save(saved, tmp)

    _nets.three_saves(root, save, _nets.file_size(_nets.state(3)[0]) // 2)


if __name__ == "__main__":
    sys.exit(_common.main(workload, check))
