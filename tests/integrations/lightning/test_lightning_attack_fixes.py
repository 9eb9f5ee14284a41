"""Defects an outside attack on the Lightning integration found (issue 35), each pinned by
the behaviour it now has."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="needs the [torch] extra")
pytest.importorskip("lightning", reason="needs the [lightning] extra")

import lightning.pytorch as pl
import torch
from tiny import tiny_model

from atomic_ckpt import atomic_write
from atomic_ckpt.integrations.lightning import AtomicCheckpointIO, AtomicModelCheckpoint


def trainer_for(root: Path, **options: Any) -> Any:
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=2,
        limit_val_batches=1,
        limit_test_batches=1,
        limit_predict_batches=1,
        plugins=[AtomicCheckpointIO()],
        callbacks=[AtomicModelCheckpoint(dirpath=root, save_last="link", **options)],
        default_root_dir=root,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


def evaluable_model() -> Any:
    """The tiny model, with a validation, a test and a predict step over its data."""
    model = tiny_model(pl)
    step = type(model).training_step
    loader = type(model).train_dataloader
    cls = type(model)
    cls.validation_step = cls.test_step = step
    cls.predict_step = lambda self, batch, batch_idx: self.net(batch[0])
    cls.val_dataloader = cls.test_dataloader = cls.predict_dataloader = loader
    return model


@pytest.mark.parametrize("stage", ["validate", "test", "predict"])
def test_an_evaluation_run_never_removes_a_save_in_progress(
    tmp_path: Path, stage: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``trainer.validate/test/predict`` with the training's callbacks (a LightningCLI
    ``validate`` run with the training's config, beside the training that is still
    saving into the directory) leaves the directory alone: the in-progress save's
    temporary file survives and the save commits. Only a fit cleans up (it owns the
    directory: Lightning allows one fit per directory)."""
    root = tmp_path / "ckpts"
    root.mkdir()
    torch.manual_seed(0)
    with atomic_write(root / "epoch=0-step=9.ckpt") as tmp:  # the training's live save
        f = open(tmp, "wb")  # noqa: SIM115 - held open across the evaluation run
        f.write(b"the first half")
        f.flush()
        with caplog.at_level(logging.INFO, logger="atomic_ckpt.integrations.lightning"):
            getattr(trainer_for(root), stage)(evaluable_model())
        assert tmp.exists(), f"trainer.{stage}() removed a save in progress"
        f.write(b", the second half")
        f.close()
    assert (root / "epoch=0-step=9.ckpt").read_bytes() == b"the first half, the second half"
    assert "left by an interrupted save" not in caplog.text


def test_a_fit_still_removes_what_a_killed_save_left(tmp_path: Path) -> None:
    """The counterpart: the setup of a fit removes an orphaned temporary file."""
    from atomic_ckpt import temp_name

    root = tmp_path / "ckpts"
    root.mkdir()
    orphan = root / temp_name("epoch=0-step=1.ckpt")
    orphan.write_bytes(b"half")
    trainer_for(root, every_n_train_steps=1).fit(evaluable_model())
    assert not os.path.lexists(orphan)
    assert (root / "last.ckpt").is_symlink()
