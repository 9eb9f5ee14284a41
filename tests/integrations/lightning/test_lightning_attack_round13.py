"""Attacks on issue 35's promises for the Lightning integration (round 13): saves by hand,
``last`` without symlinks, as a new user's script meets them."""

from __future__ import annotations

import errno
import logging
import os
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="needs the [torch] extra")
pytest.importorskip("lightning", reason="needs the [lightning] extra")

import lightning.pytorch as pl
import torch
from tiny import tiny_model

from atomic_ckpt.integrations.lightning import AtomicCheckpointIO, AtomicModelCheckpoint

LOGGER = "atomic_ckpt.integrations.lightning"


def trainer_of(root: Path, plugins: list[Any], callbacks: list[Any], steps: int) -> Any:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        plugins=plugins,
        callbacks=callbacks,
        default_root_dir=root,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


def test_the_callback_without_the_plugin_says_its_saves_are_not_atomic(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A new user swaps ``ModelCheckpoint`` for ``AtomicModelCheckpoint`` and stops there
    (the class name promises atomic checkpoints): every save, and the script's final
    ``trainer.save_checkpoint(path)``, then goes through Lightning's ``TorchCheckpointIO``,
    neither atomic nor durable. The fit must say so, naming the plugin to add."""
    callback = AtomicModelCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=1)
    trainer = trainer_of(tmp_path, [], [callback], steps=1)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        trainer.fit(tiny_model(pl))
    assert "AtomicCheckpointIO" in caplog.text
    assert "not atomic" in caplog.text


def test_the_callback_with_the_plugin_does_not_warn(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The warning above is for the missing plugin only (also async, in the chain)."""
    for async_save in (False, True):
        callback = AtomicModelCheckpoint(
            dirpath=tmp_path / f"ckpts{async_save}", every_n_train_steps=1
        )
        io = AtomicCheckpointIO(async_save=async_save)
        trainer = trainer_of(tmp_path, [io], [callback], steps=1)
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            trainer.fit(tiny_model(pl))
    assert "not atomic" not in caplog.text


@pytest.mark.parametrize("refusal", [errno.EPERM, errno.EOPNOTSUPP])
@pytest.mark.parametrize("async_save", [False, True])
def test_last_without_symlinks_is_a_whole_copy_and_resumes(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    refusal: int,
    async_save: bool,
) -> None:
    """(vfat could not be mounted here: the container's kernel has no vfat module.)
    ``os.symlink`` refused as vfat refuses it: ``save_last="link"`` writes ``last.ckpt`` as
    a copy of the newest save, warned once, and ``ckpt_path="last"`` resumes from it."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise OSError(refusal, os.strerror(refusal))

    monkeypatch.setattr(os, "symlink", refuse)
    ckpts = tmp_path / "ckpts"

    def fit(steps: int, ckpt_path: str | None) -> Any:
        callback = AtomicModelCheckpoint(
            dirpath=ckpts,
            monitor="step",
            mode="max",
            save_top_k=2,
            save_last="link",
            every_n_train_steps=1,
            enable_version_counter=False,
        )
        trainer = trainer_of(
            tmp_path, [AtomicCheckpointIO(async_save=async_save)], [callback], steps
        )
        trainer.fit(tiny_model(pl), ckpt_path=ckpt_path)
        return trainer

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        fit(3, None)
        callback = fit(5, "last").checkpoint_callback
    last = ckpts / "last.ckpt"
    assert not last.is_symlink()
    assert torch.load(last, weights_only=False)["global_step"] == 5
    # The epoch in a name is Lightning's: after a mid-epoch resume, 2.3 (like its stock
    # callback) still counts step 5 in epoch 0, later releases in epoch 1.
    kept = sorted(Path(p).name for p in callback.best_k_models)
    assert [re.sub(r"epoch=\d+-", "", name) for name in kept] == ["step=4.ckpt", "step=5.ckpt"]
    assert sorted(os.listdir(ckpts)) == [*kept, "last.ckpt"]
    assert Path(callback.last_model_path).name == "last.ckpt"
    assert (ckpts / kept[1]).read_bytes() != b""
    assert last.read_bytes() == (ckpts / kept[1]).read_bytes()
    assert caplog.text.count("refuses symlinks") == 1


@pytest.mark.parametrize("where", ["fit", "by hand"])
def test_what_a_start_or_a_save_removes_is_said_where_a_user_sees_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, where: str
) -> None:
    """Issue 35 item 2: a start (or the save by hand) that removes what a killed save left
    says what it removed, where a user sees it with logging left as it is (Python shows
    WARNING and above; the transformers integration warns for each removal)."""
    from test_lightning_by_hand_leftovers import leftover_of_a_killed_save

    ckpts, final = tmp_path / "ckpts", tmp_path / "final"
    left = leftover_of_a_killed_save(ckpts if where == "fit" else final, "epoch=0-step=1.ckpt")
    callback = AtomicModelCheckpoint(dirpath=ckpts, every_n_train_steps=1)
    trainer = trainer_of(tmp_path, [AtomicCheckpointIO()], [callback], steps=1)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        trainer.fit(tiny_model(pl))
        if where == "by hand":
            trainer.save_checkpoint(final / "final.ckpt")
    assert all(f"{name}, left by an interrupted save" in caplog.text for name in left)
