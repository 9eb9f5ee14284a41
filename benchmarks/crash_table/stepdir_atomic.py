"""Row "files into N/ + resume from the highest N", with atomic_ckpt: the same three files
written inside ``CheckpointDir(ckpt).commit(step)``; resume from ``latest()``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import _common
import _nets
from atomic_ckpt import CheckpointDir
from stepdir_plain import failing_limit, read_files, write_files


def workload(root: Path) -> None:
    """Three saves, each staged and committed as ``ckpt/<step>/``."""
    ckpts = CheckpointDir(root / "ckpt")

    def save(step: int, saved: dict[str, Any]) -> None:
        with ckpts.commit(step) as path:
            write_files(path, saved)

    _nets.three_saves(root, save, failing_limit())


def check(root: Path) -> str:
    """Resume from the newest complete checkpoint (``resume_point``); judge what it holds."""
    try:
        found = CheckpointDir(root / "ckpt").resume_point()
    except Exception as exc:
        raise _common.Violation(f"resume_point() raised {type(exc).__name__}: {exc}") from exc
    if found is None:
        return _common.judge(root, None, "ckpt/")
    return _nets.judged_load(root, f"ckpt/{found.path.name}/", lambda: read_files(found.path))


if __name__ == "__main__":
    sys.exit(_common.main(workload, check))
