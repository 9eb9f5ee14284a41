"""A save by hand killed mid-write (``trainer.save_checkpoint(path)`` outside the
``ModelCheckpoint`` dirpath, or ``AtomicCheckpointIO.save_checkpoint`` outside any
callback) leaves its temporary file, which no fit's setup ever looks at: the next save by
hand into that directory removes it (never a live write)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="needs the [torch] extra")
pytest.importorskip("lightning", reason="needs the [lightning] extra")

import torch
from tiny import tiny_model

from atomic_ckpt._core.l2_syscalls import locks as _locks
from atomic_ckpt._core.l4_protocol.onefile import _TEMP_RE
from atomic_ckpt.integrations.lightning import _checked, classes_for


def _killed_mid_save(path: str) -> None:
    """In a forked child: save ``path`` through the plugin, SIGKILLed once half of the
    file is written (the temporary beside ``path``)."""

    def half_then_die(checkpoint: Any, tmp: Any, algorithm: str) -> str:
        with open(tmp, "wb") as f:
            f.write(b"PK\x03\x04 half a checkpoint")
            f.flush()
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")

    _checked.save = half_then_die  # type: ignore[assignment]
    classes_for("lightning").AtomicCheckpointIO().save_checkpoint({"v": torch.tensor(1)}, path)


def leftover_of_a_killed_save(directory: Path, name: str) -> list[str]:
    """Kill a real save of ``directory/name`` mid-write; the temporaries it left."""
    directory.mkdir(parents=True, exist_ok=True)
    child = mp.get_context("fork").Process(target=_killed_mid_save, args=(str(directory / name),))
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL  # the fault fired
    left = [n for n in os.listdir(directory) if _TEMP_RE.fullmatch(n)]
    assert left, os.listdir(directory)
    return left


def test_the_next_direct_save_into_the_directory_removes_a_killed_saves_leftover(
    tmp_path: Path,
) -> None:
    """``AtomicCheckpointIO.save_checkpoint`` called directly after one was killed there:
    the killed one's temporary is gone, the new file is whole."""
    out = tmp_path / "exports"
    leftover_of_a_killed_save(out, "model.ckpt")
    io = classes_for("lightning").AtomicCheckpointIO()
    io.save_checkpoint({"v": torch.tensor(2)}, out / "other.ckpt")
    assert sorted(os.listdir(out)) == ["other.ckpt"]
    assert int(torch.load(out / "other.ckpt", weights_only=True)["v"]) == 2


def test_trainer_save_checkpoint_outside_the_dirpath_removes_a_killed_saves_leftover(
    tmp_path: Path,
) -> None:
    """A script's ``trainer.save_checkpoint(path)`` into a directory no ModelCheckpoint
    owns (so no fit's setup cleans it), after an earlier such save was killed: the leftover
    is removed and the new file is whole."""
    import lightning.pytorch as pl

    lightning_io = classes_for("lightning")
    final = tmp_path / "final"
    leftover_of_a_killed_save(final, "final.ckpt")
    torch.manual_seed(0)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=1,
        plugins=[lightning_io.AtomicCheckpointIO()],
        callbacks=[lightning_io.AtomicModelCheckpoint(dirpath=tmp_path / "ckpts")],
        default_root_dir=tmp_path,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(tiny_model(pl))
    assert os.listdir(final) != ["final.ckpt"]  # the fit's setup did not touch it
    trainer.save_checkpoint(final / "final.ckpt")
    assert sorted(os.listdir(final)) == ["final.ckpt"]
    assert torch.load(final / "final.ckpt", weights_only=True)["global_step"] == 1


def test_a_save_by_hand_leaves_a_live_write_in_the_directory_alone(tmp_path: Path) -> None:
    """While another write holds the directory (its temporary is live), a save by hand
    there removes nothing of it."""
    out = tmp_path / "exports"
    live = leftover_of_a_killed_save(out, "model.ckpt")
    io = classes_for("lightning").AtomicCheckpointIO()
    with _locks.writing_in(out):  # a write in progress, as another process holds it
        io.save_checkpoint({"v": torch.tensor(2)}, out / "other.ckpt")
    assert sorted(os.listdir(out)) == sorted([*live, "other.ckpt"])


def test_a_sharded_save_removes_a_killed_sharded_saves_staging_directory(tmp_path: Path) -> None:
    """The sharded strategies' directory save by hand, after one was killed there (its
    staging ``.final.ckpt.tmp-<hex>/`` half filled): rank 0 removes the leftover before
    this save begins, and the new checkpoint directory commits whole."""
    from atomic_ckpt import temp_name
    from atomic_ckpt.integrations.lightning._strategy import _AtomicShardedSave

    out = tmp_path / "exports"
    orphan = out / temp_name("final.ckpt")
    orphan.mkdir(parents=True)
    (orphan / "__0_0.distcp").write_bytes(b"half a shard")
    seen: list[list[str]] = []

    class OneRank:  # what the mixin needs of a Lightning strategy, on one rank
        _save_distributed_checkpoint = True
        is_global_zero = True

        def broadcast(self, obj: Any) -> Any:
            seen.append(sorted(os.listdir(out)))  # what is there when the save begins
            return obj

        def barrier(self, name: str | None = None) -> None:
            pass

        def save_checkpoint(self, checkpoint: Any, filepath: Any, storage_options: Any) -> None:
            os.makedirs(filepath)
            Path(filepath, "__0_0.distcp").write_bytes(b"shard 0")
            Path(filepath, ".metadata").write_bytes(b"metadata")

    class Strategy(_AtomicShardedSave, OneRank):
        pass

    Strategy().save_checkpoint({}, str(out / "final.ckpt"))
    assert seen[0] == []  # the orphan was gone before the save began
    assert sorted(os.listdir(out)) == ["final.ckpt"]
    assert sorted(os.listdir(out / "final.ckpt")) == [".metadata", "__0_0.distcp"]
