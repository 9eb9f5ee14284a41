"""Resume: the newest complete checkpoint-N, and which files each of Trainer's loads reads."""

from __future__ import annotations

import logging
import os

import torch.distributed as dist
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from atomic_ckpt import Checkpoint, CheckpointDir

log = logging.getLogger(__package__ or __name__)

CHECKPOINT_PREFIX = f"{PREFIX_CHECKPOINT_DIR}-"
"""``checkpoint-``: the step directories are Hugging Face's ``checkpoint-N``."""

_OPTIMIZER_FILES = ("optimizer", "scheduler")
"""What ``Trainer._load_optimizer_and_scheduler`` reads: ``optimizer.pt``, ``scheduler.pt``
(and the ``optimizer*`` of FSDP), by the start of their names."""
_LATE_FILES = ("rng_state", "scaler", "trainer_state")
"""What Trainer reads after the optimizer (``trainer_state.json``, twice, ``scaler.pt``)
or at the first step (``rng_state*.pth``), by the start of their names."""


def _read_with(name: str) -> str:
    """Which of Trainer's resume loads reads the checkpoint file ``name``: ``"optimizer"``,
    ``"late"`` (RNG, scaler, trainer state) or ``"model"`` (everything else: the weights,
    ``config.json``, adapters; files Trainer never reads go with them)."""
    base = name.rsplit("/", 1)[-1]
    if base.startswith(_OPTIMIZER_FILES):
        return "optimizer"
    if base.startswith(_LATE_FILES):
        return "late"
    return "model"


def _loaded_by(checkpoint: Checkpoint, rank: int, distributed: bool) -> list[str]:
    """The files of ``checkpoint`` Trainer loads on ``rank``: all but the other ranks' RNG
    states (``rng_state_<r>.pth``, one per process of a multi-process run)."""
    names = [e.path for e in checkpoint.manifest.files if e.type == "file"]
    if not distributed:
        return names
    mine = f"rng_state_{rank}.pth"
    return [n for n in names if not (n.startswith("rng_state_") and n != mine)]


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _rank() -> int:
    return dist.get_rank() if _distributed() else 0


def _barrier() -> None:
    if _distributed():
        dist.barrier()


def _checkpoints(output_dir: str | os.PathLike[str], *, durable: bool = True) -> CheckpointDir:
    return CheckpointDir(output_dir, prefix=CHECKPOINT_PREFIX, durable=durable)


def _clean(ckpts: CheckpointDir) -> None:
    try:
        removed = ckpts.clean()
    except OSError as exc:  # resuming matters more; the next clean() retries
        log.warning("could not remove what killed saves left in %s: %s", ckpts.root, exc)
        return
    for path in removed:
        log.warning("removed %s, left by a killed save", path)
