"""Row "HF Trainer: the script's final save_model() + save_state()", plain ``Trainer``: it
writes each file straight into ``output_dir``. See ``_hf_final``."""

from __future__ import annotations

import sys
from pathlib import Path

from transformers import Trainer

import _common
import _hf_final


def workload(root: Path) -> None:
    """Three final saves by a plain Trainer."""
    _hf_final.workload(root, Trainer)


def check(root: Path) -> str:
    """Load the final model; judge it."""
    return _hf_final.check(root)


if __name__ == "__main__":
    sys.exit(_common.main(workload, check))
