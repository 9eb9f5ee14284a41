"""A background save that fails never ends ``fit`` silently (issue 30 item 22): it is
logged at ERROR when it fails, on the rank it failed on, and raised by the next save or,
for the last save of the run, by teardown at the end of ``fit``."""

from __future__ import annotations

import errno
import logging
import os
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="needs the [torch] extra")
pytest.importorskip("lightning", reason="needs the [lightning] extra")

import lightning.pytorch as pl
import torch
from tiny import tiny_model

from atomic_ckpt.integrations.lightning import AtomicCheckpointIO, AtomicModelCheckpoint, _checked


def _fit(root: Path, steps: int) -> None:
    torch.set_num_threads(1)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        plugins=[AtomicCheckpointIO(async_save=True)],
        callbacks=[AtomicModelCheckpoint(dirpath=root, save_top_k=-1, every_n_train_steps=1)],
        default_root_dir=root,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(tiny_model(pl))


class _FailingSave:
    """``_checked.save`` that raises ENOSPC for the ``fail_at``-th save (1-based), on the
    background thread; records every save it saw and the one it failed."""

    def __init__(self, fail_at: int) -> None:
        self.fail_at = fail_at
        self.calls: list[str] = []
        self.failed: list[str] = []
        self.real = _checked.save

    def __call__(self, checkpoint: Any, path: Any, algorithm: str) -> None:
        self.calls.append(os.fspath(path))
        assert threading.current_thread() is not threading.main_thread()  # async
        if len(self.calls) == self.fail_at:
            self.failed.append(os.fspath(path))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(path))
        self.real(checkpoint, path, algorithm)


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.ERROR and r.name == "atomic_ckpt.integrations.lightning"
    ]


def test_a_failed_background_save_is_logged_and_raised_by_the_next_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The second of five saves fails: fit raises that ENOSPC, the failure was logged at
    ERROR naming the checkpoint and the rank, no save queued behind it ran, and the failed
    checkpoint is not on disk."""
    fault = _FailingSave(fail_at=2)
    monkeypatch.setattr(_checked, "save", fault)
    root = tmp_path / "ckpts"
    with caplog.at_level(logging.ERROR), pytest.raises(OSError, match="No space left") as info:
        _fit(root, steps=5)
    assert fault.failed, "the injected fault did not fire"
    assert info.value.errno == errno.ENOSPC
    assert fault.failed[0] in str(info.value)  # (the temporary file it was writing)
    final = root / "epoch=0-step=2.ckpt"
    messages = _errors(caplog)
    assert len(messages) == 1, messages
    assert f"save {final} failed on rank 0" in messages[0]
    assert "No space left" in messages[0]
    assert not final.exists()
    assert not Path(fault.failed[0]).exists()
    assert len(fault.calls) == 2  # nothing queued behind the failed save ran


def test_a_failed_last_save_is_raised_at_teardown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The last save of the run fails, after which nothing saves again: fit does not return
    normally, teardown raises the error (and it was logged at ERROR)."""
    fault = _FailingSave(fail_at=3)
    monkeypatch.setattr(_checked, "save", fault)
    root = tmp_path / "ckpts"
    with caplog.at_level(logging.ERROR), pytest.raises(OSError, match="No space left") as info:
        _fit(root, steps=3)
    assert fault.failed, "the injected fault did not fire"
    assert len(fault.calls) == 3  # the failing save was the last one queued
    assert info.value.errno == errno.ENOSPC
    assert any(entry.name == "teardown" for entry in info.traceback), info.traceback
    assert len(_errors(caplog)) == 1
    saved = sorted(p.name for p in root.iterdir() if p.suffix == ".ckpt")
    assert len(saved) == 2  # the two saves before it are whole


def test_a_background_save_on_a_full_disk_raises_disk_full_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """ENOSPC in a background save surfaces as DiskFullError (an OSError with that errno),
    whose message says the disk is full and to free space, as a commit's does."""
    from atomic_ckpt import DiskFullError

    fault = _FailingSave(fail_at=2)
    monkeypatch.setattr(_checked, "save", fault)
    root = tmp_path / "ckpts"
    with caplog.at_level(logging.ERROR), pytest.raises(DiskFullError) as info:
        _fit(root, steps=5)
    assert info.value.errno == errno.ENOSPC
    assert "is full" in str(info.value)
    assert "Free space" in str(info.value)
    assert isinstance(info.value.__cause__, OSError)
    assert "is full" in _errors(caplog)[0]
