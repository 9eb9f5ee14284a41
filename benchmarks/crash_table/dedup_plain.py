"""Row "write only what changed (carry + dedup)", plain: the saves of ``dedup_atomic``
written straight into ``ckpt/<step>/``; a carried ``frozen.pt`` is hard-linked from
``ckpt/1/`` (``os.link``, as incremental savers do), and the source is deleted with
``shutil.rmtree``. Resume from the highest numbered directory."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

import _common
import _nets
from dedup_atomic import FROZEN_FILE, check_frozen, frozen, run_saves
from stepdir_plain import read_files, write_files


def workload(root: Path) -> None:
    base = root / "ckpt"

    def save(step: int, saved: dict[str, Any], carry: bool) -> None:
        directory = base / str(step)
        directory.mkdir(parents=True, exist_ok=True)
        if not carry:
            torch.save(frozen(), directory / FROZEN_FILE)
        elif not (directory / FROZEN_FILE).exists():
            os.link(base / "1" / FROZEN_FILE, directory / FROZEN_FILE)
        write_files(directory, saved)

    run_saves(root, save)
    shutil.rmtree(base / "1")


def check(root: Path) -> str:
    """Resume from the highest numbered directory of ``ckpt/``; its frozen file too."""
    steps = [int(p.name) for p in (root / "ckpt").glob("*") if p.name.isdigit() and p.is_dir()]
    if not steps:
        return _common.judge(root, None, "ckpt/")
    directory = root / "ckpt" / str(max(steps))
    where = f"ckpt/{directory.name}/"
    verdict = _nets.judged_load(root, where, lambda: read_files(directory))
    check_frozen(directory / FROZEN_FILE, where + FROZEN_FILE)
    return verdict


if __name__ == "__main__":
    sys.exit(_common.main(workload, check))
