"""A final ``save_model`` (or a whole run) aimed at a committed ``checkpoint-N`` must not
change that checkpoint: it is refused, or the checkpoint still verifies afterwards."""

from __future__ import annotations

from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from test_hf_trainer_api import make_trainer  # noqa: E402

from atomic_ckpt import CheckpointDir, CheckpointError  # noqa: E402


def still_as_committed(out: Path, step: int) -> None:
    CheckpointDir(out, prefix="checkpoint-").verify(step)


@pytest.mark.xfail(
    strict=True,
    reason="save_model into a committed checkpoint-N renames new files over its committed "
    "ones: the checkpoint no longer matches its manifest (a mix of two saves)",
)
def test_save_model_into_a_committed_checkpoint_leaves_it_as_committed(tmp_path: Path) -> None:
    """``save_model("out/checkpoint-2")`` after training on: refused, or checkpoint-2 verifies."""
    out = tmp_path / "out"
    trainer = make_trainer(out, max_steps=4, save_steps=2)
    trainer.train()
    try:
        trainer.save_model(str(out / "checkpoint-2"))
    except (CheckpointError, ValueError):
        return  # refused, saying why: fine
    still_as_committed(out, 2)


@pytest.mark.xfail(
    strict=True,
    reason="output_dir set to a committed checkpoint-N: the run commits checkpoint-M inside "
    "it and its final save overwrites its files; the checkpoint no longer verifies",
)
def test_a_run_whose_output_dir_is_a_checkpoint_leaves_it_as_committed(tmp_path: Path) -> None:
    """output_dir = checkpoint-2, resumed from it, final save: refused, or checkpoint-2 verifies."""
    out = tmp_path / "out"
    make_trainer(out, max_steps=2, save_steps=2).train()
    inner = out / "checkpoint-2"
    trainer = make_trainer(inner, max_steps=4, save_steps=2)
    try:
        trainer.train(resume_from_checkpoint=str(inner))
        trainer.save_model()
        trainer.save_state()
    except (CheckpointError, ValueError):
        return  # refused, saying why: fine
    still_as_committed(out, 2)
