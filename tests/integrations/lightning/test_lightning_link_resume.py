"""``verify_on_load=True`` resumes through the ``last.ckpt`` link that
``AtomicModelCheckpoint(save_last="link")`` makes (and through a user's own link to a
``.ckpt``), verifying the file the link names; a damaged target is still refused."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="needs the [torch] extra")
pytest.importorskip("lightning", reason="needs the [lightning] extra")

import lightning.pytorch as pl
import torch
from tiny import tiny_model

from atomic_ckpt import VerificationError
from atomic_ckpt.integrations.lightning import AtomicCheckpointIO, AtomicModelCheckpoint


def fit(root: Path, io: AtomicCheckpointIO, steps: int, ckpt_path: str | None = None) -> Any:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = tiny_model(pl, torch.optim.Adam)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        plugins=[io],
        callbacks=[AtomicModelCheckpoint(dirpath=root, save_last="link", every_n_train_steps=2)],
        default_root_dir=root,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, ckpt_path=ckpt_path)
    return trainer


def test_fit_resumes_verified_through_the_last_link(tmp_path: Path) -> None:
    """``save_last="link"`` then ``fit(ckpt_path="last")`` with verify_on_load resumes."""
    root = tmp_path / "ckpts"
    fit(root, AtomicCheckpointIO(verify_on_load=True), steps=2)
    assert (root / "last.ckpt").is_symlink()
    trainer = fit(root, AtomicCheckpointIO(verify_on_load=True), steps=4, ckpt_path="last")
    assert trainer.global_step == 4


def test_a_verified_load_through_a_users_link_verifies_its_target(tmp_path: Path) -> None:
    """A user's link to a ``.ckpt`` loads verified; a damaged target is refused."""
    io = AtomicCheckpointIO(verify_on_load=True)
    target = tmp_path / "epoch=0.ckpt"
    weights = torch.arange(1 << 12, dtype=torch.float32)
    io.save_checkpoint({"w": weights}, target)
    link = tmp_path / "mine.ckpt"
    os.symlink(target.name, link)
    assert torch.equal(io.load_checkpoint(link)["w"], weights)
    data = bytearray(target.read_bytes())
    data[data.index(weights.numpy().tobytes()) + 1000] ^= 1
    target.write_bytes(bytes(data))
    with pytest.raises(VerificationError, match="checksum"):
        io.load_checkpoint(link)


@pytest.mark.parametrize("start", ["fresh", "last", "explicit path"])
def test_every_fit_start_removes_what_killed_saves_left_and_says_so(
    tmp_path: Path, start: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The temporary file of a save killed mid-write (and of a killed ``last`` link) in the
    checkpoint directory: removed when the next fit sets up, however it starts (a fresh
    fit into the directory, ``ckpt_path="last"``, an explicit path), each logged."""
    import logging

    from atomic_ckpt import temp_name

    root = tmp_path / "ckpts"
    fit(root, AtomicCheckpointIO(), steps=2)
    orphans = [root / temp_name("epoch=0-step=4.ckpt"), root / temp_name("last.ckpt")]
    orphans[0].write_bytes(b"half a checkpoint")
    os.symlink("epoch=0-step=2.ckpt", orphans[1])
    ckpt_path = {"fresh": None, "last": "last", "explicit path": str(root / "last.ckpt")}[start]
    with caplog.at_level(logging.INFO, logger="atomic_ckpt.integrations.lightning"):
        trainer = fit(root, AtomicCheckpointIO(), steps=4, ckpt_path=ckpt_path)
    assert trainer.global_step == 4
    for orphan in orphans:
        assert not os.path.lexists(orphan)
        assert f"removed {orphan}, left by an interrupted save" in caplog.text
