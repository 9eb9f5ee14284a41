"""Save and load a PyTorch training state inside one atomic commit.

A checkpoint made by :func:`save_state` holds:

* ``model.safetensors``: the model's parameters and buffers (safetensors;
  shared and tied tensors are stored once and restored shared);
* ``optimizer.pt`` and ``scheduler.pt``: their ``state_dict()`` with
  ``torch.save``, loaded back with ``weights_only=True`` (never arbitrary pickle);
* ``training_state.json``: the step, the epoch and any JSON user metadata.

Needs the ``torch`` extra: ``pip install 'atomic_ckpt[torch]'``.
"""

from __future__ import annotations

import json
import operator
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, SupportsIndex

import torch
from safetensors.torch import load_model, save_model

from atomic_ckpt import Checkpoint, CheckpointDir

__all__ = [
    "MODEL_FILE",
    "OPTIMIZER_FILE",
    "SCHEDULER_FILE",
    "STATE_FILE",
    "TrainingState",
    "load_state",
    "resume",
    "save_state",
    "write_state",
]

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
STATE_FILE = "training_state.json"


class _Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> Any: ...


@dataclass(frozen=True)
class TrainingState:
    """What :func:`load_state` restored besides the objects it loaded into."""

    step: int
    path: Path
    epoch: int | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)


def write_state(
    directory: str | os.PathLike[str],
    *,
    step: SupportsIndex,
    model: torch.nn.Module,
    optimizer: _Stateful | None = None,
    scheduler: _Stateful | None = None,
    epoch: int | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> None:
    """Write a training state into ``directory`` (typically the path a commit yields)."""
    out = Path(directory)
    save_model(model, str(out / MODEL_FILE))
    if optimizer is not None:
        torch.save(optimizer.state_dict(), out / OPTIMIZER_FILE)
    if scheduler is not None:
        torch.save(scheduler.state_dict(), out / SCHEDULER_FILE)
    doc = {"step": operator.index(step), "epoch": epoch, "metadata": dict(metadata or {})}
    (out / STATE_FILE).write_text(json.dumps(doc, indent=1) + "\n")


def save_state(
    ckpts: CheckpointDir,
    step: SupportsIndex,
    *,
    model: torch.nn.Module,
    optimizer: _Stateful | None = None,
    scheduler: _Stateful | None = None,
    epoch: int | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> Checkpoint:
    """Commit a training state as checkpoint ``step`` of ``ckpts``, atomically and durably."""
    with ckpts.begin(step, metadata=metadata) as commit:
        write_state(
            commit.path,
            step=operator.index(step),
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            epoch=epoch,
            metadata=metadata,
        )
    return commit.publish()  # published on leaving the block: returns its checkpoint


def load_state(
    checkpoint: Checkpoint | str | os.PathLike[str],
    *,
    model: torch.nn.Module,
    optimizer: _Stateful | None = None,
    scheduler: _Stateful | None = None,
    strict: bool = True,
    device: str = "cpu",
) -> TrainingState:
    """Load a state written by :func:`save_state` into ``model`` (and optimizer, scheduler).

    Pickled state is loaded with ``weights_only=True``. Raises FileNotFoundError
    if the checkpoint lacks a file for an object you passed.
    """
    path = checkpoint.path if isinstance(checkpoint, Checkpoint) else Path(checkpoint)
    missing, unexpected = load_model(model, str(path / MODEL_FILE), strict=strict, device=device)
    del missing, unexpected  # with strict=True, load_model raises on either
    if optimizer is not None:
        optimizer.load_state_dict(_load_pickle(path / OPTIMIZER_FILE, device))
    if scheduler is not None:
        scheduler.load_state_dict(_load_pickle(path / SCHEDULER_FILE, device))
    doc = json.loads((path / STATE_FILE).read_text())
    return TrainingState(
        step=int(doc["step"]),
        path=path,
        epoch=doc.get("epoch"),
        metadata=doc.get("metadata") or {},
    )


def resume(
    ckpts: CheckpointDir,
    *,
    model: torch.nn.Module,
    optimizer: _Stateful | None = None,
    scheduler: _Stateful | None = None,
    verify: bool = False,
    device: str = "cpu",
    fresh: bool = False,
) -> TrainingState | None:
    """Load the latest complete checkpoint of ``ckpts``; None if there is none.

    A root holding step directories without a marker and no complete checkpoint
    raises :class:`~atomic_ckpt.UnmarkedCheckpointsError` rather than start from
    scratch over them, unless ``fresh=True`` (see ``CheckpointDir.resume_point``).

    With ``verify=True`` the files are checked against the manifest (sizes and
    checksums) first, which reads them once more; a newest checkpoint that does
    not verify is skipped with a warning, and the newest one that does is loaded
    (as ``atomic_ckpt.distributed.resume`` does).
    """
    latest = ckpts.resume_point(verify=verify, fresh=fresh)
    if latest is None:
        return None
    return load_state(latest, model=model, optimizer=optimizer, scheduler=scheduler, device=device)


def _load_pickle(path: Path, device: str) -> dict[str, Any]:
    state = torch.load(path, map_location=device, weights_only=True)
    if not isinstance(state, dict):
        raise ValueError(f"{path} does not hold a state dict")
    return state
