"""Row "HF Trainer (save_steps, resume_from_checkpoint=True)", plain ``Trainer``: it writes
``checkpoint-N/`` in place and resumes from ``get_last_checkpoint``. See ``_hf``."""

from __future__ import annotations

import sys
from pathlib import Path

from transformers import Trainer
from transformers.trainer_utils import get_last_checkpoint

import _common
import _hf


def workload(root: Path) -> None:
    """Three saves by a plain Trainer."""
    _hf.workload(root, Trainer)


def check(root: Path) -> str:
    """Resume a plain Trainer with ``resume_from_checkpoint=True``; judge what it loaded."""
    return _hf.check(root, Trainer, get_last_checkpoint)


if __name__ == "__main__":
    sys.exit(_common.main(workload, check))
