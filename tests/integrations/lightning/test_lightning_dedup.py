"""``AtomicCheckpointIO(dedup=True)``: a save whose bytes equal the previous save's is a link
to it (``last.ckpt`` of ``save_last=True`` beside the top-k file just saved), never
trusted when that file changed, and nothing the plugin does later writes through it."""

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

from atomic_ckpt.integrations.lightning import AtomicCheckpointIO

STATE = {"weights": torch.arange(4096, dtype=torch.float32), "step": 3}


def _ino(path: Path) -> int:
    return os.lstat(path).st_ino


def test_an_identical_save_is_a_link_to_the_previous_one(tmp_path: Path) -> None:
    io = AtomicCheckpointIO(dedup=True, verify_on_load=True)
    a, b, c = tmp_path / "a.ckpt", tmp_path / "b.ckpt", tmp_path / "c.ckpt"
    io.save_checkpoint(STATE, a)
    io.save_checkpoint(STATE, b)
    assert io.deduped == {str(b): io.deduped[str(b)]}
    assert io.deduped[str(b)] in ("hardlink", "reflink")
    if io.deduped[str(b)] == "hardlink":
        assert _ino(a) == _ino(b)
    io.save_checkpoint({**STATE, "step": 4}, c)  # other bytes: a file of its own
    assert str(c) not in io.deduped
    assert os.lstat(c).st_nlink == 1
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]
    assert io.load_checkpoint(b)["step"] == 3  # verified against its own checksum


def test_without_dedup_identical_saves_are_separate_files(tmp_path: Path) -> None:
    io = AtomicCheckpointIO()
    io.save_checkpoint(STATE, tmp_path / "a.ckpt")
    io.save_checkpoint(STATE, tmp_path / "b.ckpt")
    assert io.deduped == {}
    assert os.lstat(tmp_path / "b.ckpt").st_nlink == 1


def test_a_previous_file_changed_since_its_save_is_not_trusted(tmp_path: Path) -> None:
    io = AtomicCheckpointIO(dedup=True)
    a, b = tmp_path / "a.ckpt", tmp_path / "b.ckpt"
    io.save_checkpoint(STATE, a)
    st = os.stat(a)
    with open(a, "r+b") as f:  # written in place after its save, same size
        f.seek(100)
        f.write(b"XXXX")
    if os.stat(a).st_mtime_ns == st.st_mtime_ns:  # within one clock tick: one tick later
        os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    io.save_checkpoint(STATE, b)
    assert io.deduped == {}
    assert _ino(a) != _ino(b)
    assert AtomicCheckpointIO(verify_on_load=True).load_checkpoint(b)["step"] == 3


def test_later_saves_and_removals_never_write_through_the_link(tmp_path: Path) -> None:
    """The shared-inode rule in the plugin: saving over one name of a linked pair writes a
    new file (renamed over it), and removing one name leaves the other whole."""
    io = AtomicCheckpointIO(dedup=True, verify_on_load=True)
    a, b = tmp_path / "a.ckpt", tmp_path / "b.ckpt"
    io.save_checkpoint(STATE, a)
    io.save_checkpoint(STATE, b)
    if io.deduped.get(str(b)) != "hardlink":
        pytest.skip("the filesystem did not hard-link")
    before = a.read_bytes()
    io.save_checkpoint({**STATE, "step": 9}, b)  # over the link's name
    assert a.read_bytes() == before
    assert io.load_checkpoint(a)["step"] == 3
    assert io.load_checkpoint(b)["step"] == 9
    io.save_checkpoint({**STATE, "step": 9}, a)  # now equal to b: linked again
    assert _ino(a) == _ino(b)
    io.remove_checkpoint(b)
    assert io.load_checkpoint(a)["step"] == 9
    assert os.lstat(a).st_nlink == 1


def test_dedup_needs_the_checksum() -> None:
    with pytest.raises(ValueError, match="checksum=None"):
        AtomicCheckpointIO(dedup=True, checksum=None)


def _fit(root: Path, io: Any, steps: int) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    callback = pl.callbacks.ModelCheckpoint(
        dirpath=root / "ckpts", save_last=True, save_top_k=-1, every_n_train_steps=1
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        callbacks=[callback],
        plugins=[io],
        default_root_dir=root,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(tiny_model(pl))


def test_save_last_copy_is_stored_once_in_a_real_fit(tmp_path: Path) -> None:
    """ModelCheckpoint(save_last=True) saves last.ckpt as a second full save of the state
    just saved as the top-k file: with dedup it is a link to that file."""
    io = AtomicCheckpointIO(dedup=True, verify_on_load=True)
    _fit(tmp_path, io, steps=3)
    ckpts = tmp_path / "ckpts"
    last = ckpts / "last.ckpt"
    newest = ckpts / "epoch=0-step=3.ckpt"
    assert str(last) in io.deduped, sorted(io.deduped)
    assert last.read_bytes() == newest.read_bytes()
    if io.deduped[str(last)] == "hardlink":
        assert _ino(last) == _ino(newest)
    assert io.load_checkpoint(last, weights_only=False)["global_step"] == 3
