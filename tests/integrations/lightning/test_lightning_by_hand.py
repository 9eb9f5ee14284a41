"""A save by hand is whole and durable when it returns (issue 35 item 1):
``trainer.save_checkpoint(path)`` called by a script or a hook, and ``AtomicCheckpointIO``'s
methods called directly, also with ``async_save=True`` (which queues only what a checkpoint
callback asks for)."""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="needs the [torch] extra")
pytest.importorskip("lightning", reason="needs the [lightning] extra")
pytest.importorskip("pytorch_lightning", reason="needs pytorch-lightning (the test extra)")

import torch
from slow_io import Caller, SlowWriter
from tiny import tiny_model

from atomic_ckpt._core.l2_syscalls import fs as _fs
from atomic_ckpt._core.l4_protocol.onefile import _TEMP_RE
from atomic_ckpt.integrations.lightning import classes_for

PACKAGES = ["lightning", "pytorch_lightning"]


def pl_of(package: str) -> Any:
    return importlib.import_module("lightning.pytorch" if package == "lightning" else package)


@pytest.fixture
def slow(monkeypatch: pytest.MonkeyPatch) -> Iterator[SlowWriter]:
    """A disk that holds every write off the main thread until the gate opens."""
    writer = SlowWriter()
    writer.install(monkeypatch)
    yield writer
    writer.gate.set()


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every file and directory fsync, in order, as ("file" | "dir", path)."""
    seen: list[tuple[str, str]] = []
    real_file, real_dir = _fs.fsync_file, _fs.fsync_dir

    def fsync_file(path: Any) -> None:
        seen.append(("file", os.fspath(path)))
        real_file(path)

    def fsync_dir(path: Any) -> None:
        seen.append(("dir", os.fspath(path)))
        real_dir(path)

    monkeypatch.setattr(_fs, "fsync_file", fsync_file)
    monkeypatch.setattr(_fs, "fsync_dir", fsync_dir)
    return seen


def assert_durable(path: Path, fsyncs: list[tuple[str, str]]) -> None:
    """``path`` was written aside, fsynced, renamed into place and its directory fsynced."""
    files = [i for i, (kind, p) in enumerate(fsyncs) if kind == "file"]
    ours = [i for i in files if _TEMP_RE.fullmatch(Path(fsyncs[i][1]).name or "")]
    ours = [i for i in ours if Path(fsyncs[i][1]).parent == path.parent]
    assert ours, f"no temporary file beside {path} was fsynced: {fsyncs}"
    assert ("dir", str(path.parent)) in fsyncs[ours[-1] :], fsyncs


def trainer_of(pl: Any, root: Path, io: Any, callbacks: list[Any], steps: int) -> Any:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        plugins=[io],
        callbacks=callbacks,
        enable_checkpointing=bool(callbacks),
        default_root_dir=root,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


@pytest.mark.parametrize("package", PACKAGES)
@pytest.mark.parametrize("async_save", [False, True])
def test_trainer_save_checkpoint_after_fit_is_durable_when_it_returns(
    tmp_path: Path,
    package: str,
    async_save: bool,
    slow: SlowWriter,
    fsyncs: list[tuple[str, str]],
) -> None:
    """A script's final ``trainer.save_checkpoint(path)``: on return the file is in place,
    loads, and was fsynced before its rename, the directory after it, though the slow disk
    still holds every background write (async_save=True queues none of it)."""
    pl = pl_of(package)
    io = classes_for(package).AtomicCheckpointIO(async_save=async_save)
    trainer = trainer_of(pl, tmp_path, io, [], steps=2)
    trainer.fit(tiny_model(pl))
    final = tmp_path / "out" / "final.ckpt"
    fsyncs.clear()
    trainer.save_checkpoint(final)
    assert final.is_file(), "trainer.save_checkpoint returned before the file was written"
    assert torch.load(final, weights_only=True)["global_step"] == 2
    assert_durable(final, fsyncs)
    assert slow.held == 0  # nothing went to the background thread
    assert sorted(os.listdir(final.parent)) == ["final.ckpt"]


def test_a_save_by_hand_during_fit_waits_for_the_queued_saves(
    tmp_path: Path, slow: SlowWriter, fsyncs: list[tuple[str, str]]
) -> None:
    """A hook (not a checkpoint callback) calls ``trainer.save_checkpoint`` while the
    callback's saves are still queued behind a slow disk: it returns only once they and
    its own file are durable, in that order; the callback's saves stay in the background."""
    pl = pl_of("lightning")
    classes = classes_for("lightning")
    ckpts, hand = tmp_path / "ckpts", tmp_path / "hand.ckpt"
    seen: dict[str, Any] = {}

    class ByHand(pl.Callback):  # type: ignore[misc,name-defined]
        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            if trainer.global_step != 2:
                return
            seen["step 1 on disk before"] = (ckpts / "step=1.ckpt").exists()
            threading.Timer(0.5, slow.gate.set).start()  # the disk catches up later
            fsyncs.clear()
            trainer.save_checkpoint(hand)
            seen["hand"] = hand.is_file() and torch.load(hand, weights_only=True)["global_step"]
            seen["callback's files"] = sorted(os.listdir(ckpts))
            seen["durable"] = list(fsyncs)

    checkpoint = classes.AtomicModelCheckpoint(
        dirpath=ckpts, filename="{step}", every_n_train_steps=1, save_top_k=-1, save_last="link"
    )
    io = classes.AtomicCheckpointIO(async_save=True)
    # Lightning runs the checkpoint callback after the others: at step 2, ByHand finds
    # step 1's save and link queued, held by the slow disk.
    trainer_of(pl, tmp_path, io, [checkpoint, ByHand()], steps=3).fit(tiny_model(pl))
    assert seen["step 1 on disk before"] is False, "the callback's save was not queued"
    assert seen["hand"] == 2
    # What was queued before it (step 1 and its link) was on disk when the hand save returned.
    assert seen["callback's files"] == ["last.ckpt", "step=1.ckpt"]
    assert_durable(hand, seen["durable"])
    assert slow.held == 3  # steps 1-3, and no more: the hand save was not queued
    assert os.readlink(ckpts / "last.ckpt") == "step=3.ckpt"


def test_the_plugin_called_directly_is_done_when_it_returns(
    tmp_path: Path, slow: SlowWriter, fsyncs: list[tuple[str, str]]
) -> None:
    """``AtomicCheckpointIO(async_save=True)`` used outside any callback: save, link and
    remove are done (durably) on return; a direct save after a queued save of the same
    path waits for it, so the direct one is what stays."""
    io = classes_for("lightning").AtomicCheckpointIO(async_save=True)
    try:
        a, b, last = tmp_path / "a.ckpt", tmp_path / "b.ckpt", tmp_path / "last.ckpt"
        io.save_checkpoint({"v": torch.tensor(1)}, a)
        assert int(torch.load(a, weights_only=True)["v"]) == 1
        assert_durable(a, fsyncs)
        io.link(a, last)
        assert os.readlink(last) == "a.ckpt"
        Caller(io).save_checkpoint({"v": torch.tensor(2)}, b)  # queued: the disk holds it
        assert not b.exists()
        threading.Timer(0.5, slow.gate.set).start()
        io.save_checkpoint({"v": torch.tensor(3)}, b)  # by hand: after the queued one
        assert int(torch.load(b, weights_only=True)["v"]) == 3
        io.remove_checkpoint(a)
        assert not a.exists()
        io.teardown()
        assert int(torch.load(b, weights_only=True)["v"]) == 3  # not overwritten later
        assert slow.held == 1
    finally:
        slow.gate.set()
        io.teardown()
