"""Row "files into N/ + resume from the highest N", plain: ``ckpt/<step>/`` is created and
``model.pt``, ``optim.pt`` and ``meta.json`` are written into it; resume from the highest
numbered directory. The saves and the check: see ``_common``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

import _common
import _nets


def write_files(directory: Path, saved: dict[str, Any]) -> None:
    """A save's three files, written into ``directory`` (largest last: optim.pt)."""
    torch.save(saved["model"], directory / "model.pt")
    torch.save(saved["optim"], directory / "optim.pt")
    (directory / "meta.json").write_text(json.dumps({"step": saved["step"]}))


def read_files(directory: Path) -> str:
    """Load a step directory's three files as a resuming job does; the loaded state's digest."""
    return _nets.load(
        {
            "model": torch.load(directory / "model.pt", weights_only=True),
            "optim": torch.load(directory / "optim.pt", weights_only=True),
            "step": json.loads((directory / "meta.json").read_text())["step"],
        }
    )


def failing_limit() -> int:
    """A full disk in the middle of save 3's optim.pt (its model.pt fits)."""
    saved = _nets.state(3)[0]
    return (_nets.file_size(saved["model"]) + _nets.file_size(saved["optim"])) // 2


def workload(root: Path) -> None:
    """Three saves into ``ckpt/<step>/`` directly."""

    def save(step: int, saved: dict[str, Any]) -> None:
        directory = root / "ckpt" / str(step)
        directory.mkdir(parents=True, exist_ok=True)
        write_files(directory, saved)

    _nets.three_saves(root, save, failing_limit())


def check(root: Path) -> str:
    """Resume from the highest numbered directory of ``ckpt/``; judge what it holds."""
    steps = [int(p.name) for p in (root / "ckpt").glob("*") if p.name.isdigit() and p.is_dir()]
    if not steps:
        return _common.judge(root, None, "ckpt/")
    directory = root / "ckpt" / str(max(steps))
    return _nets.judged_load(root, f"ckpt/{directory.name}/", lambda: read_files(directory))


if __name__ == "__main__":
    sys.exit(_common.main(workload, check))
