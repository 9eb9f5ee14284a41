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


def test_a_second_fit_into_the_directory_leaves_a_save_in_progress_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A fit started into the directory of another training that is saving there (a sweep
    whose runs share ``dirpath``, a requeued job whose old process still runs) leaves that
    save's temporary alone: the save commits whole, instead of failing with "the block
    wrote nothing" because the new fit's setup deleted its file. It says why it cleaned
    nothing; a later fit, once that save is done, cleans as before."""
    from atomic_ckpt import temp_name

    root = tmp_path / "ckpts"
    root.mkdir()
    orphan = root / temp_name("epoch=0-step=1.ckpt")
    orphan.write_bytes(b"half")  # a killed save's, kept until no write is in progress
    torch.manual_seed(0)
    with atomic_write(root / "epoch=0-step=9.ckpt") as tmp:  # the other training's save
        with open(tmp, "wb") as f:
            f.write(b"the first half")
        with caplog.at_level(logging.INFO):
            trainer_for(root, every_n_train_steps=1).fit(evaluable_model())
        assert tmp.exists(), "a second fit removed a save in progress"
        with open(tmp, "ab") as f:
            f.write(b", the second half")
    assert (root / "epoch=0-step=9.ckpt").read_bytes() == b"the first half, the second half"
    assert "a write is in progress" in caplog.text
    trainer_for(root, every_n_train_steps=1).fit(evaluable_model())
    assert not os.path.lexists(orphan)


def test_a_sharded_save_in_progress_survives_a_clean_of_its_directory(tmp_path: Path) -> None:
    """The sharded strategies' staging directory (``.epoch=0.ckpt.tmp-<hex>/``, filled by
    every rank before rank 0 commits it) is a write in progress while the ranks fill it:
    a clean of the directory then (another fit's setup) removes nothing, and the
    checkpoint directory commits whole."""
    from atomic_ckpt import clean_temporaries
    from atomic_ckpt.integrations.lightning._strategy import _AtomicShardedSave

    root = tmp_path / "ckpts"
    root.mkdir()
    cleaned: list[list[Path]] = []

    class OneRank:  # what the mixin needs of a Lightning strategy, on one rank
        _save_distributed_checkpoint = True
        is_global_zero = True

        def broadcast(self, obj: Any) -> Any:
            return obj

        def barrier(self, name: str | None = None) -> None:
            pass

        def save_checkpoint(self, checkpoint: Any, filepath: Any, storage_options: Any) -> None:
            os.makedirs(filepath)
            Path(filepath, "__0_0.distcp").write_bytes(b"shard 0")
            cleaned.append(clean_temporaries(root))  # another fit starts meanwhile
            Path(filepath, ".metadata").write_bytes(b"metadata")

    class Strategy(_AtomicShardedSave, OneRank):
        pass

    Strategy().save_checkpoint({}, str(root / "epoch=0.ckpt"))
    assert cleaned == [[]], "the clean removed the staging directory in progress"
    assert sorted(os.listdir(root / "epoch=0.ckpt")) == [".metadata", "__0_0.distcp"]


def test_a_clean_while_last_directory_becomes_a_link_leaves_the_new_link_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``last.ckpt/`` a directory (a sharded ``save_last=True`` copy) replaced by the
    ``last`` link: the new link is made under a temporary name and exchanged with the
    directory. A clean of the directory in between (another fit's setup) removes nothing
    (it removed the new link, and the save failed with ``FileNotFoundError``); ``last`` is
    then the link."""
    from atomic_ckpt import clean_temporaries
    from atomic_ckpt.integrations.lightning import _links

    root = tmp_path / "ckpts"
    (root / "last.ckpt").mkdir(parents=True)
    (root / "last.ckpt" / "__0_0.distcp").write_bytes(b"old shard")
    (root / "epoch=1.ckpt").mkdir()
    (root / "epoch=1.ckpt" / "__0_0.distcp").write_bytes(b"new shard")
    cleaned: list[list[Path]] = []
    real = _links._fs.rename_exchange

    def exchange(a: Path, b: Path) -> None:
        cleaned.append(clean_temporaries(root))  # another fit starts meanwhile
        real(a, b)

    monkeypatch.setattr(_links._fs, "rename_exchange", exchange)
    _links._replace_link("epoch=1.ckpt", str(root / "last.ckpt"), durable=True)
    assert len(cleaned) == 1, "the exchange was not reached"
    assert cleaned == [[]], "the clean removed the link in progress"
    assert os.readlink(root / "last.ckpt") == "epoch=1.ckpt"
    assert sorted(os.listdir(root)) == ["epoch=1.ckpt", "last.ckpt"]
