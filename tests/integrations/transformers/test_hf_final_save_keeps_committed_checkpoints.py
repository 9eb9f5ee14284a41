"""A final save (or a whole run) aimed at a committed ``checkpoint-N``, or inside one, never
changes that checkpoint: it is refused with :class:`~atomic_ckpt.InsideCheckpointError`
naming it, before anything is written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from test_hf_trainer_api import make_trainer  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from atomic_ckpt import CheckpointDir, InsideCheckpointError  # noqa: E402
from atomic_ckpt.integrations.transformers import AtomicTrainer  # noqa: E402


class Began(TrainerCallback):
    """Records that Trainer's training loop began (so a refusal came before it)."""

    def __init__(self) -> None:
        self.began = False

    def on_train_begin(self, *args: object, **kwargs: object) -> None:
        self.began = True


def as_committed(out: Path, step: int) -> list[str]:
    """Verify ``checkpoint-<step>`` and return its entries (nothing added, nothing changed)."""
    CheckpointDir(out, prefix="checkpoint-").verify(step)
    return sorted(os.listdir(out / f"checkpoint-{step}"))


def trained(out: Path) -> tuple[AtomicTrainer, list[str]]:
    trainer = make_trainer(out, max_steps=4, save_steps=2)
    trainer.train()
    return trainer, as_committed(out, 2)


def test_save_model_into_a_committed_checkpoint_is_refused(tmp_path: Path) -> None:
    """``save_model("out/checkpoint-2")`` after training on: refused, checkpoint-2 unchanged."""
    out = tmp_path / "out"
    trainer, before = trained(out)
    with pytest.raises(InsideCheckpointError, match="amend") as caught:
        trainer.save_model(str(out / "checkpoint-2"))
    assert caught.value.path == (out / "checkpoint-2").resolve()
    assert caught.value.step == 2
    assert isinstance(caught.value, ValueError)
    assert as_committed(out, 2) == before


def test_save_model_into_a_directory_inside_a_checkpoint_is_refused(tmp_path: Path) -> None:
    """``save_model("out/checkpoint-2/export")``: refused too, nothing made inside it."""
    out = tmp_path / "out"
    trainer, before = trained(out)
    with pytest.raises(InsideCheckpointError, match="checkpoint-2"):
        trainer.save_model(str(out / "checkpoint-2" / "export"))
    assert as_committed(out, 2) == before


def test_save_model_through_a_link_to_a_checkpoint_is_refused(tmp_path: Path) -> None:
    """A link naming a committed checkpoint (``out/latest -> checkpoint-2``) is that checkpoint."""
    out = tmp_path / "out"
    trainer, before = trained(out)
    (tmp_path / "latest").symlink_to(out / "checkpoint-2")
    with pytest.raises(InsideCheckpointError, match="checkpoint-2"):
        trainer.save_model(str(tmp_path / "latest"))
    assert as_committed(out, 2) == before


def test_a_run_whose_output_dir_is_a_checkpoint_is_refused_at_train(tmp_path: Path) -> None:
    """output_dir = checkpoint-2, resumed from it: train() refuses at once, nothing written."""
    out = tmp_path / "out"
    make_trainer(out, max_steps=2, save_steps=2).train()
    before = as_committed(out, 2)
    inner = out / "checkpoint-2"
    trainer = make_trainer(inner, max_steps=4, save_steps=2)
    began = Began()
    trainer.add_callback(began)
    with pytest.raises(InsideCheckpointError, match="output_dir"):
        trainer.train(resume_from_checkpoint=str(inner))
    assert not began.began  # refused before Trainer's loop started
    assert as_committed(out, 2) == before


def test_the_final_saves_of_a_run_inside_a_checkpoint_are_refused(tmp_path: Path) -> None:
    """output_dir inside checkpoint-2: save_model, save_state and save_metrics each refuse."""
    out = tmp_path / "out"
    make_trainer(out, max_steps=2, save_steps=2).train()
    before = as_committed(out, 2)
    trainer = make_trainer(out / "checkpoint-2", max_steps=1)
    for save in (
        trainer.save_model,
        trainer.save_state,
        lambda: trainer.save_metrics("train", {"loss": 1.0}),
    ):
        with pytest.raises(InsideCheckpointError):
            save()
    assert as_committed(out, 2) == before


def test_save_model_into_the_run_directory_still_works(tmp_path: Path) -> None:
    """The run's own output_dir, which holds the checkpoints, is no checkpoint: saved there."""
    out = tmp_path / "out"
    trainer, before = trained(out)
    trainer.save_model()
    assert (out / "model.safetensors").is_file()
    assert as_committed(out, 2) == before
