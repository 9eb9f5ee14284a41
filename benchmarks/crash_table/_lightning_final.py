"""The Lightning final-save rows: a script that ends with ``trainer.save_checkpoint(path)``
called by hand, and loads its model back with ``LightningModule.load_from_checkpoint``.

Save 1: a fresh fit of 1 step without ``ModelCheckpoint`` (``enable_checkpointing=False``),
then ``trainer.save_checkpoint("ckpt/final.ckpt")``. Save 2: another fresh fit (another
seed) saves over it. Save 3: a third fit's save on a disk that fills up half-way through
the file. The state a save writes is the module's ``state_dict``, digested just before the
call; the check loads ``ckpt/final.ckpt`` with ``Boring.load_from_checkpoint`` and digests
the same. No file is nothing saved (a fresh start).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Trainer

import _common
import _lightning

FINAL = "final.ckpt"


def trainer(root: Path, plugins: list[Any]) -> Trainer:
    """A CPU Trainer of 1 step that saves nothing by itself."""
    return Trainer(
        accelerator="cpu",
        max_steps=1,
        default_root_dir=str(root / "ckpt"),
        plugins=plugins,
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


def _final_save(root: Path, save: int, run: Trainer, module: _lightning.Boring) -> None:
    _common.begin(root, save, _common.digest({"model": module.state_dict()}))
    run.save_checkpoint(root / "ckpt" / FINAL)


def workload(root: Path, plugins: Callable[[], list[Any]]) -> None:
    """The three saves (module docstring); ``plugins()`` gives each Trainer its plugins.
    Temporary files go to ``root/tmp``, as in ``_lightning.workload`` (where Lightning's
    own save writes each file first)."""
    _common.open_journal(root)
    (root / "tmp").mkdir()
    tempfile.tempdir = str(root / "tmp")
    runs = []
    for save in (1, 2, 3):
        torch.manual_seed(save)
        module = _lightning.Boring()
        run = trainer(root, plugins())
        run.fit(module)
        runs.append((run, module))
        if save < 3:
            _final_save(root, save, run, module)
            _common.returned(root, save)
    limit = os.path.getsize(root / "ckpt" / FINAL) // 2
    third, module = runs[-1]
    _common.failing_save(root, 3, limit, lambda: _final_save(root, 3, third, module))


def check(root: Path) -> str:
    """Load the model from ``ckpt/final.ckpt`` as a user would; judge it."""
    path = root / "ckpt" / FINAL
    if not path.exists():
        return _common.judge(root, None, "ckpt/")
    try:
        module = _lightning.Boring.load_from_checkpoint(path, map_location="cpu")
    except Exception as exc:
        raise _common.Violation(f"cannot load {FINAL}: {type(exc).__name__}: {exc}") from exc
    return _common.judge(root, _common.digest({"model": module.state_dict()}), FINAL)
