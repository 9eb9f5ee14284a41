"""The torch DCP rows: the small model's state (``_nets``) saved with ``dcp.save`` in one
process (``no_dist=True``) as ``ckpt/<step>/``, loaded back with plain ``dcp.load``.

The state is an ``AppState`` (model and optimizer through DCP's ``get_state_dict`` and
``set_state_dict``, and the step), as torchtitan and ``examples/dcp_trainer.py`` save it.
Save 3 runs on a disk that fills up half-way through its ``__0_0.distcp``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

import _common
import _nets

warnings.filterwarnings("ignore", message="torch.distributed is disabled")
warnings.filterwarnings("ignore", ".*process group.*")

DATA = "__0_0.distcp"


class AppState(Stateful):
    """What a checkpoint holds: model, optimizer, step."""

    def __init__(self, model: torch.nn.Module, optim: torch.optim.Optimizer, step: int) -> None:
        self.model, self.optim, self.step = model, optim, step

    def state_dict(self) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optim)
        return {"model": model_sd, "optim": optim_sd, "step": self.step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_state_dict(
            self.model,
            self.optim,
            model_state_dict=state_dict["model"],
            optim_state_dict=state_dict["optim"],
        )
        self.step = state_dict["step"]


def workload(root: Path, save: Callable[[int, dict[str, Any]], None]) -> None:
    """Saves 1 and 2 (step 1, twice) and the failing save 3 (step 2), each through
    ``save(step, {"app": AppState})``."""
    _common.open_journal(root)
    for k in (1, 2, 3):
        model, optim = _nets.trained(k)
        step = _nets.STEPS[k]
        _common.begin(root, k, _nets.state_digest(model, optim, step))
        state = {"app": AppState(model, optim, step)}
        if k < 3:
            save(step, state)
            _common.returned(root, k)
        else:
            limit = os.path.getsize(root / "ckpt" / "1" / DATA) // 2
            _common.failing_save(root, k, limit, lambda: save(step, state))  # noqa: B023 - called at once


def load(directory: Path) -> str:
    """``dcp.load`` of ``directory`` into a fresh model and optimizer; their digest."""
    model, optim = _nets.fresh()
    app = AppState(model, optim, 0)
    dcp.load({"app": app}, checkpoint_id=directory, no_dist=True)
    return _nets.state_digest(model, optim, int(app.step))
