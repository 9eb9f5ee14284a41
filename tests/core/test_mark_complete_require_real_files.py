"""``mark_complete(require=...)`` and ``mark-complete --require``: a required file is a file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from atomic_ckpt import CheckpointDir, VerificationError
from atomic_ckpt.cli import main


def _legacy(tmp_path: Path) -> tuple[CheckpointDir, Path]:
    step = tmp_path / "ckpts" / "4"
    step.mkdir(parents=True)
    (step / "model.pt").write_bytes(b"model")
    return CheckpointDir(tmp_path / "ckpts"), step


def test_require_refuses_a_dangling_symlink(tmp_path: Path) -> None:
    """A required file that is a dangling symlink is missing: the directory is not adopted."""
    ckpts, step = _legacy(tmp_path)
    os.symlink("never-written.pt", step / "optimizer.pt")
    with pytest.raises(VerificationError, match=r"optimizer\.pt"):
        ckpts.mark_complete(4, require=["model.pt", "optimizer.pt"])
    assert not (step / "checkpoint_complete").exists()


def test_require_refuses_a_directory_in_the_files_place(tmp_path: Path) -> None:
    """A directory where a required file should be does not satisfy ``require=``."""
    ckpts, step = _legacy(tmp_path)
    (step / "optimizer.pt").mkdir()
    with pytest.raises(VerificationError, match=r"optimizer\.pt"):
        ckpts.mark_complete(4, require=["model.pt", "optimizer.pt"])
    assert not (step / "checkpoint_complete").exists()


def test_cli_require_agrees_with_the_api_on_a_dotted_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``mark-complete --require sub/../model.pt`` gives the API's verdict, never 'delete it'."""
    _ckpts, step = _legacy(tmp_path)
    status = main(["mark-complete", str(step), "--require", "sub/../model.pt"])
    err = capsys.readouterr().err
    assert "Delete the directory" not in err
    assert status in (0, 2)
