"""Lightning's own tests of the ``last`` link, with ``AtomicModelCheckpoint`` (and
``AtomicCheckpointIO``) in place of the stock classes (issue 35 item 4).

Ported from Lightning 2.6.5's ``tests/tests_pytorch/checkpointing/test_model_checkpoint.py``
(``test_model_checkpoint_link_checkpoint``, ``..._link_checkpoint_relative_path``,
``test_model_checkpoint_save_last``, ``..._save_last_as_link_not_local``) and
``tests/tests_pytorch/callbacks/test_model_checkpoint_additional_cases.py``
(``test_model_checkpoint_save_last_link_symlink_bug``): the same scenarios and the same
assertions, written here (CI cannot fetch Lightning's test tree). ``_link_checkpoint`` is
called with a ``Mock()`` trainer as Lightning calls it, and with a trainer whose
``CheckpointIO`` is ours (synchronous or asynchronous), which makes the link itself.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from unittest.mock import Mock

import pytest

pytest.importorskip("torch", reason="needs the [torch] extra")
pytest.importorskip("lightning", reason="needs the [lightning] extra")

import torch
from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.demos.boring_classes import BoringModel

from atomic_ckpt.integrations.lightning import AtomicCheckpointIO, AtomicModelCheckpoint

IOS = ["none", "sync", "async"]


def trainer_for(io: str) -> Any:
    """Lightning's ``Mock()`` trainer ("none"), or one whose CheckpointIO is ours."""
    if io == "none":
        return Mock()
    trainer = Mock(spec=["is_global_zero", "strategy"])
    trainer.strategy = Mock(spec=["checkpoint_io", "barrier"])
    trainer.strategy.checkpoint_io = AtomicCheckpointIO(async_save=io == "async")
    return trainer


def link(trainer: Any, filepath: Path, linkpath: Path) -> None:
    AtomicModelCheckpoint._link_checkpoint(trainer, filepath=str(filepath), linkpath=str(linkpath))


def assert_relative_link(linkpath: Path, target: Path) -> None:
    assert os.path.islink(linkpath)
    assert os.path.realpath(linkpath) == str(target)
    assert not os.path.isabs(os.readlink(linkpath))


@pytest.mark.parametrize("io", IOS)
def test_link_checkpoint_makes_and_replaces_links(
    tmp_path: Path, io: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new link; then over a link that names a file, over a link again, over a real
    directory, over a link to a directory: each time a relative link to the new target.
    And where ``symlink`` fails with a bare OSError (Lightning's stand-in for Windows
    without the symlink privilege), a copy of the file instead."""
    trainer = trainer_for(io)
    file, linkpath = tmp_path / "file", tmp_path / "link"
    file.touch()
    link(trainer, file, linkpath)
    assert_relative_link(linkpath, file)

    for name in ("new_file1", "new_file2"):
        new = tmp_path / name
        new.touch()
        link(trainer, new, linkpath)
        assert_relative_link(linkpath, new)

    folder, folder_link = tmp_path / "folder", tmp_path / "folder_link"
    folder.mkdir()
    folder_link.mkdir()  # a real directory where the link goes
    link(trainer, folder, folder_link)
    assert_relative_link(folder_link, folder)

    new_folder = tmp_path / "new_folder"
    new_folder.mkdir()
    link(trainer, new_folder, folder_link)  # a link to a directory, replaced
    assert_relative_link(folder_link, new_folder)

    win_file, win_link = tmp_path / "win_file", tmp_path / "win_link"
    win_file.write_bytes(b"weights")
    refused: list[str] = []

    def no_privilege(*args: Any, **kwargs: Any) -> None:
        refused.append(os.fspath(args[1]))
        raise OSError  # no errno, as Lightning's test raises it

    monkeypatch.setattr(os, "symlink", no_privilege)
    link(trainer, win_file, win_link)
    monkeypatch.undo()
    assert refused, "the symlink refusal was never injected"
    assert not os.path.islink(win_link)
    assert os.path.isfile(win_link)  # the fallback: a copy
    assert win_link.read_bytes() == b"weights"
    if io != "none":
        trainer.strategy.checkpoint_io.teardown()


@pytest.mark.parametrize("io", IOS)
def test_link_checkpoint_with_a_relative_working_directory(
    tmp_path: Path, io: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Absolute paths given, run from elsewhere: the link holds the target's name relative
    to the link's directory."""
    monkeypatch.chdir(tmp_path)
    folder = Path("x/z/z")
    folder.mkdir(parents=True)
    file, linkpath = folder / "file", folder / "link"
    file.touch()
    link(trainer_for(io), file.absolute(), linkpath.absolute())
    assert os.path.islink(linkpath)
    assert Path(os.readlink(linkpath)) == file.relative_to(folder)
    assert not os.path.isabs(os.readlink(linkpath))


class LogsEarlyStopOn(BoringModel):  # type: ignore[misc]
    """Lightning's ``LogInTwoMethods``: logs ``early_stop_on`` (the training loss)."""

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        out = super().training_step(batch, batch_idx)
        self.log("early_stop_on", out["loss"])
        return out

    def on_validation_epoch_end(self) -> None:
        self.log("val_acc", torch.tensor(1.23))


@pytest.mark.parametrize("save_last", [True, "link"])
@pytest.mark.parametrize("with_io", [False, True])
def test_save_last_leaves_one_last_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, save_last: Any, with_io: bool
) -> None:
    """3 epochs of 10 steps, ``save_top_k=-1``, the last file named ``last-{epoch}``: one
    file per epoch and a single ``last``, a link (or a file) that resolves to the newest."""
    seed_everything()
    monkeypatch.setattr(AtomicModelCheckpoint, "CHECKPOINT_NAME_LAST", "last-{epoch}")
    checkpoint = AtomicModelCheckpoint(
        monitor="early_stop_on", dirpath=tmp_path, save_top_k=-1, save_last=save_last
    )
    trainer = Trainer(
        default_root_dir=tmp_path,
        callbacks=[checkpoint],
        plugins=[AtomicCheckpointIO()] if with_io else [],
        max_epochs=3,
        limit_train_batches=10,
        limit_val_batches=10,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(LogsEarlyStopOn())
    last_name = (
        checkpoint._format_checkpoint_name(
            AtomicModelCheckpoint.CHECKPOINT_NAME_LAST, {"epoch": trainer.current_epoch - 1}
        )
        + ".ckpt"
    )
    assert str(tmp_path / last_name) == checkpoint.last_model_path
    expected = {f"epoch={i}-step={j}.ckpt" for i, j in zip(range(3), [10, 20, 30], strict=True)}
    assert set(os.listdir(tmp_path)) == expected | {last_name}
    if save_last == "link":
        assert os.path.islink(tmp_path / last_name)
    else:
        assert os.path.isfile(tmp_path / last_name)
    assert os.path.realpath(tmp_path / last_name) == checkpoint._last_checkpoint_saved


def test_save_last_link_is_refused_for_a_path_that_is_not_local() -> None:
    """``save_last="link"`` into an fsspec URL: ValueError at setup, as the stock one."""
    callback = AtomicModelCheckpoint(dirpath="memory://not-a-filesystem-path", save_last="link")
    with pytest.raises(ValueError, match=r"save_last='link'.* is only supported for local file"):
        callback.setup(trainer=Trainer(logger=False), pl_module=BoringModel(), stage="fit")


@pytest.mark.parametrize("with_io", [False, True])
def test_save_last_link_with_top_k_all_never_links_to_itself(tmp_path: Path, with_io: bool) -> None:
    """``save_last="link"``, ``save_top_k=-1`` and no epoch checkpoint in 2 epochs
    (``every_n_epochs=10``): ``last.ckpt`` exists and, if a link, does not name itself."""
    trainer = Trainer(
        default_root_dir=tmp_path,
        max_epochs=2,
        callbacks=[
            AtomicModelCheckpoint(
                dirpath=tmp_path, every_n_epochs=10, save_last="link", save_top_k=-1
            )
        ],
        plugins=[AtomicCheckpointIO()] if with_io else [],
        enable_checkpointing=True,
        enable_model_summary=False,
        enable_progress_bar=False,
        logger=False,
    )
    trainer.fit(BoringModel())
    last = tmp_path / "last.ckpt"
    assert last.exists()
    if os.path.islink(last):
        assert os.readlink(last) != str(last)
