"""Row "HF Trainer: the script's final save_model() + save_state()", with atomic_ckpt:
``AtomicTrainer`` writes the final model aside and moves each file into ``output_dir``
atomically and durably. See ``_hf_final``."""

from __future__ import annotations

import sys
from pathlib import Path

import _common
import _hf_final
from atomic_ckpt.integrations.transformers import AtomicTrainer


def workload(root: Path) -> None:
    """Three final saves by an AtomicTrainer."""
    _hf_final.workload(root, AtomicTrainer)


def check(root: Path) -> str:
    """Load the final model; judge it."""
    return _hf_final.check(root)


if __name__ == "__main__":
    sys.exit(_common.main(workload, check))
