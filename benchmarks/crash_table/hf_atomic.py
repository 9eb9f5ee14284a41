"""Row "HF Trainer (save_steps, resume_from_checkpoint=True)", with atomic_ckpt:
``AtomicTrainer`` commits each ``checkpoint-N/`` and resumes from the newest complete one
(``last_checkpoint``). See ``_hf``."""

from __future__ import annotations

import sys
from pathlib import Path

import _common
import _hf
from atomic_ckpt.integrations.transformers import AtomicTrainer, last_checkpoint


def workload(root: Path) -> None:
    """Three saves by an AtomicTrainer."""
    _hf.workload(root, AtomicTrainer)


def check(root: Path) -> str:
    """Resume an AtomicTrainer with ``resume_from_checkpoint=True``; judge what it loaded."""
    return _hf.check(root, AtomicTrainer, last_checkpoint)


if __name__ == "__main__":
    sys.exit(_common.main(workload, check))
