"""Row "torch.save to the final file", plain: ``torch.save`` into ``ckpt/ckpt-<step>.pt``
itself; resume from the highest step. The saves and the check: see ``_common``."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch

import _common
import _nets


def newest(root: Path) -> Path | None:
    """The resume path: the ``ckpt-<step>.pt`` with the highest step (hidden names never match)."""
    found = [
        (int(p.stem[5:]), p) for p in (root / "ckpt").glob("ckpt-*.pt") if p.stem[5:].isdigit()
    ]
    return max(found)[1] if found else None


def workload(root: Path) -> None:
    """Three saves, each opening the final name and writing into it."""

    def save(step: int, saved: dict[str, Any]) -> None:
        os.makedirs(root / "ckpt", exist_ok=True)
        torch.save(saved, root / "ckpt" / f"ckpt-{step}.pt")

    _nets.three_saves(root, save, _nets.file_size(_nets.state(3)[0]) // 2)


def check(root: Path) -> str:
    """Load the newest ``ckpt-<step>.pt`` as a resuming job would; judge what it holds."""
    path = newest(root)
    if path is None:
        return _common.judge(root, None, "ckpt/")
    return _nets.judged_load(
        root, path.name, lambda: _nets.load(torch.load(path, weights_only=True))
    )


if __name__ == "__main__":
    sys.exit(_common.main(workload, check))
