"""``atomic-ckpt demo --trainer`` (``run_trainer_demo``): a Trainer killed mid-save resumes."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from atomic_ckpt import CheckpointDir
from atomic_ckpt.cli.demo.trainer import run_trainer_demo


def test_trainer_demo_kills_mid_save_and_resumes_bit_identical(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The demo's trainer is killed in the save of step 4, resumes from checkpoint-2 and
    ends bit-identical to an uninterrupted run, with save_total_limit's two checkpoints."""
    assert run_trainer_demo(str(tmp_path / "demo"), steps=6) == 0
    out = capsys.readouterr().out
    assert ">>> SIGKILL sent to the trainer" in out
    assert "resumed from checkpoint-2, the newest complete checkpoint" in out
    assert "bit-identical to a run that\n   was never killed" in out
    ckpts = CheckpointDir(tmp_path / "demo" / "output_dir", prefix="checkpoint-")
    assert ckpts.steps() == [4, 6]


def test_trainer_demo_refuses_a_used_directory_and_odd_steps(tmp_path: Path) -> None:
    """A non-empty directory or an odd or too small --steps is refused before anything runs."""
    (tmp_path / "x").write_text("x")
    with pytest.raises(FileExistsError):
        run_trainer_demo(str(tmp_path), steps=6)
    with pytest.raises(ValueError, match="even --steps"):
        run_trainer_demo(None, steps=5)
