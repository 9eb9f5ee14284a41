"""A full disk met by the final ``save_model``/``save_state``/``save_metrics`` says so as a
checkpoint commit does: :class:`~atomic_ckpt.DiskFullError` naming the directory and what
to do, the previous files untouched, nothing left behind."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from test_hf_trainer_api import make_trainer  # noqa: E402
from transformers import Trainer  # noqa: E402
from transformers.trainer_callback import TrainerState  # noqa: E402

from atomic_ckpt import DiskFullError  # noqa: E402


def _full(*args: Any, **kwargs: Any) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _half_then_full(self: Any, output_dir: str | None = None, _internal_call: bool = False) -> None:
    assert output_dir is not None
    Path(output_dir, "model.safetensors").write_bytes(b"half a model")
    _full()


def test_a_full_disk_in_the_final_save_model_raises_disk_full_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """save_model on a disk filling as the weights are written: DiskFullError, old files kept."""
    out = tmp_path / "out"
    trainer = make_trainer(out, max_steps=1)
    trainer.save_model()
    before = (out / "model.safetensors").read_bytes()
    monkeypatch.setattr(Trainer, "save_model", _half_then_full)
    with pytest.raises(DiskFullError, match="full"):
        trainer.save_model()
    assert (out / "model.safetensors").read_bytes() == before
    assert not [p for p in os.listdir(out) if ".tmp-" in p]


def test_a_full_disk_in_save_state_raises_disk_full_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """save_state on a full disk: DiskFullError naming the disk, as a commit's."""
    out = tmp_path / "out"
    out.mkdir()
    trainer = make_trainer(out, max_steps=1)
    monkeypatch.setattr(TrainerState, "save_to_json", _full)
    with pytest.raises(DiskFullError, match="full"):
        trainer.save_state()


def test_a_full_disk_in_save_metrics_raises_disk_full_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """save_metrics on a full disk: DiskFullError naming the disk, as a commit's."""
    out = tmp_path / "out"
    out.mkdir()
    trainer = make_trainer(out, max_steps=1)
    monkeypatch.setattr("atomic_ckpt.integrations.transformers._final.json.dump", _full)
    with pytest.raises(DiskFullError, match="full"):
        trainer.save_metrics("train", {"loss": 1.0})
