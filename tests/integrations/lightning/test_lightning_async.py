"""The async save keeps Lightning's order (exp6), ``last`` never dangles, and the plugin's
own contract: errors surface, dependent operations are skipped, loading is weights-only."""

from __future__ import annotations

import errno
import importlib
import os
import pickle
import subprocess
import sys
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

import atomic_ckpt.integrations.lightning as integration
from atomic_ckpt._core.l2_syscalls import fs as _fs
from atomic_ckpt._core.l4_protocol.onefile import _TEMP_RE
from atomic_ckpt.integrations import UntestedVersionWarning
from atomic_ckpt.integrations.lightning import classes_for

PACKAGES = ["lightning", "pytorch_lightning"]


def pl_of(package: str) -> Any:
    return importlib.import_module("lightning.pytorch" if package == "lightning" else package)


def fit(pl: Any, root: Path, plugins: list[Any], callbacks: list[Any], steps: int = 3) -> Any:
    torch.set_num_threads(1)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        plugins=plugins,
        callbacks=callbacks,
        default_root_dir=root,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(tiny_model(pl))
    return trainer


def top_k_files(ckpt_dir: Path) -> list[str]:
    return sorted(n for n in os.listdir(ckpt_dir) if n.endswith(".ckpt") and n != "last.ckpt")


@pytest.fixture
def slow(monkeypatch: pytest.MonkeyPatch) -> Iterator[SlowWriter]:
    writer = SlowWriter()
    writer.install(monkeypatch)
    yield writer
    writer.gate.set()


def observer(pl: Any, ckpt_dir: Path, slow: SlowWriter) -> tuple[Any, list[str]]:
    """A callback that notes, before each step after the first, what ``last.ckpt`` is, and
    opens the slow writer's gate when training ends (so teardown can finish)."""
    seen: list[str] = []

    class Observer(pl.Callback):  # type: ignore[misc,name-defined]
        def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
            if trainer.global_step == 0:
                return
            last = ckpt_dir / "last.ckpt"
            if last.is_symlink() and not last.exists():
                seen.append("dangling")
            elif last.exists():
                seen.append("ok")
            else:
                seen.append("absent")
            seen.append(f"files={len(top_k_files(ckpt_dir)) if ckpt_dir.exists() else 0}")

        def on_train_end(self, *args: Any) -> None:
            slow.gate.set()

    return Observer(), seen


CHECKPOINT = {"save_top_k": 1, "save_last": "link", "every_n_train_steps": 1}


@pytest.mark.parametrize("package", PACKAGES)
def test_exp6_plain_lightning_async_deletes_before_it_saves(
    package: str, tmp_path: Path, slow: SlowWriter
) -> None:
    """The race the plugin exists to fix, shown on plain Lightning: with AsyncCheckpointIO and a
    slow disk, ``last.ckpt`` dangles during training and save_top_k=1 ends with 3 files."""
    pl = pl_of(package)
    ckpt_dir = tmp_path / "ckpts"
    ckpt_dir.mkdir()  # as in exp6 (else Lightning's link fails before the first save lands)
    watch, seen = observer(pl, ckpt_dir, slow)
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=ckpt_dir, **CHECKPOINT)
    fit(pl, tmp_path, [pl.plugins.AsyncCheckpointIO()], [watch, checkpoint])
    assert slow.held == 3, "the slow writer was not in the way"
    assert "dangling" in seen  # last.ckpt named a file not yet written
    assert len(top_k_files(ckpt_dir)) == 3  # save_top_k=1: the deletes ran before the saves


@pytest.mark.parametrize("package", PACKAGES)
def test_exp6_plugin_async_keeps_the_order(package: str, tmp_path: Path, slow: SlowWriter) -> None:
    """The same run with AtomicCheckpointIO(async_save=True) and AtomicModelCheckpoint:
    training does not wait for the slow disk, ``last`` never dangles, one top-k file is left
    and ``last`` names it."""
    pl = pl_of(package)
    classes = classes_for(package)
    ckpt_dir = tmp_path / "ckpts"
    ckpt_dir.mkdir()  # the same start as the plain run
    watch, seen = observer(pl, ckpt_dir, slow)
    checkpoint = classes.AtomicModelCheckpoint(dirpath=ckpt_dir, **CHECKPOINT)
    fit(pl, tmp_path, [classes.AtomicCheckpointIO(async_save=True)], [watch, checkpoint])
    assert slow.held == 3, "the slow writer was not in the way"
    # Training ran on while nothing was written yet (the writes waited for the gate).
    assert seen == ["absent", "files=0", "absent", "files=0"]
    files = top_k_files(ckpt_dir)
    assert files == [Path(checkpoint.best_model_path).name]
    assert os.readlink(ckpt_dir / "last.ckpt") == files[0]
    assert torch.load(ckpt_dir / "last.ckpt", weights_only=True)["global_step"] == 3
    assert [n for n in os.listdir(ckpt_dir) if _TEMP_RE.fullmatch(n)] == []


@pytest.mark.parametrize("atomic_callback", [False, True])
def test_a_top_k_delete_never_leaves_last_dangling(
    atomic_callback: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """save_top_k=1 with a linked last: Lightning deletes the old file before it moves the
    link (a crash there finds no last checkpoint and starts from scratch); the atomic
    callback moves the link first. Checked at every delete."""
    pl = pl_of("lightning")
    classes = classes_for("lightning")
    ckpt_dir = tmp_path / "ckpts"
    at_delete: list[bool] = []
    real = _fs.unlink

    def unlink(path: Path) -> None:
        last = ckpt_dir / "last.ckpt"
        at_delete.append(last.is_symlink() and (last.parent / os.readlink(last)) == Path(path))
        real(path)

    monkeypatch.setattr(_fs, "unlink", unlink)
    cls = classes.AtomicModelCheckpoint if atomic_callback else pl.callbacks.ModelCheckpoint
    fit(pl, tmp_path, [classes.AtomicCheckpointIO()], [cls(dirpath=ckpt_dir, **CHECKPOINT)])
    assert len(at_delete) == 2, "no top-k delete happened"
    assert any(at_delete) is not atomic_callback
    assert len(top_k_files(ckpt_dir)) == 1
    assert (ckpt_dir / "last.ckpt").exists()


def test_lightning_async_wrapper_is_refused(tmp_path: Path) -> None:
    """AtomicModelCheckpoint with Lightning's AsyncCheckpointIO: a clear error, no training."""
    pl = pl_of("lightning")
    classes = classes_for("lightning")
    wrapped = pl.plugins.AsyncCheckpointIO(classes.AtomicCheckpointIO())
    callback = classes.AtomicModelCheckpoint(dirpath=tmp_path / "ckpts", **CHECKPOINT)
    with pytest.raises(ValueError, match=r"async_save=True"):
        fit(pl, tmp_path, [wrapped], [callback])
    assert not (tmp_path / "ckpts").exists() or top_k_files(tmp_path / "ckpts") == []


# ------------------------------------------------------------------ the plugin alone


@pytest.fixture
def aio(slow: SlowWriter) -> Iterator[Any]:
    """An ``AtomicCheckpointIO(async_save=True)`` called as a checkpoint callback calls it."""
    io = classes_for("lightning").AtomicCheckpointIO(async_save=True)
    yield Caller(io)
    slow.gate.set()
    io.teardown()


def test_an_older_save_never_overwrites_a_newer_one(
    aio: Any, slow: SlowWriter, tmp_path: Path
) -> None:
    """Two queued saves of one path end with the second's contents; the caller never waited."""
    path = tmp_path / "a.ckpt"
    aio.save_checkpoint({"v": torch.tensor(1)}, path)
    aio.save_checkpoint({"v": torch.tensor(2)}, path)
    assert not path.exists()  # both still queued behind the slow disk
    slow.gate.set()
    aio.teardown()
    assert slow.held == 2
    assert int(aio.load_checkpoint(path)["v"]) == 2


def test_the_snapshot_is_taken_when_save_is_called(
    aio: Any, slow: SlowWriter, tmp_path: Path
) -> None:
    """A tensor changed after save_checkpoint returned is saved as it was at the call."""
    weight = torch.zeros(3)
    aio.save_checkpoint({"w": weight}, tmp_path / "a.ckpt")
    weight += 1
    slow.gate.set()
    aio.wait()
    assert torch.equal(aio.load_checkpoint(tmp_path / "a.ckpt")["w"], torch.zeros(3))


def test_a_background_error_surfaces_and_what_depends_on_it_is_skipped(
    aio: Any, slow: SlowWriter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC in a queued save: the next call (here wait()) raises it, and the delete and the
    link queued behind it do not run (the previous checkpoint stays, ``last`` still names it)."""
    old = tmp_path / "old.ckpt"
    aio.save_checkpoint({"v": torch.tensor(1)}, old)
    aio.link(old, tmp_path / "last.ckpt")
    slow.gate.set()
    aio.wait()
    slow.gate.clear()
    hits: list[Path] = []

    def fsync_file(path: Path) -> None:
        hits.append(Path(path))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(_fs, "fsync_file", fsync_file)
    new = tmp_path / "new.ckpt"
    aio.save_checkpoint({"v": torch.tensor(2)}, new)
    aio.remove_checkpoint(old)
    aio.link(new, tmp_path / "last.ckpt")
    slow.gate.set()
    with pytest.raises(OSError, match=os.strerror(errno.ENOSPC)) as info:
        aio.wait()
    assert hits, "the injected fault did not fire"
    assert "not done because of this error" in "\n".join(info.value.__notes__)
    assert sorted(os.listdir(tmp_path)) == ["last.ckpt", "old.ckpt"]
    assert os.readlink(tmp_path / "last.ckpt") == "old.ckpt"
    aio.wait()  # reported once; the plugin works again
    monkeypatch.undo()
    aio.save_checkpoint({"v": torch.tensor(3)}, new)
    aio.wait()
    assert new.exists()


def test_load_is_weights_only_unless_told(tmp_path: Path) -> None:
    """A checkpoint holding an arbitrary pickled object loads only with weights_only=False;
    storage options and URLs are refused."""
    io = classes_for("pytorch_lightning").AtomicCheckpointIO()
    path = tmp_path / "a.ckpt"
    io.save_checkpoint({"obj": Path("x"), "w": torch.ones(1)}, path)
    with pytest.raises(Exception, match="Weights only load failed"):
        io.load_checkpoint(path)
    assert io.load_checkpoint(path, weights_only=False)["obj"] == Path("x")
    with pytest.raises(FileNotFoundError):
        io.load_checkpoint(tmp_path / "missing.ckpt")
    with pytest.raises(TypeError, match="storage_options"):
        io.save_checkpoint({}, path, storage_options={"x": 1})
    with pytest.raises(ValueError, match="local files only"):
        io.save_checkpoint({}, "s3://bucket/a.ckpt")


def test_classes_for_both_packages_are_their_own(tmp_path: Path) -> None:
    """Each package gets classes built on its own bases (a Trainer checks isinstance), and
    they pickle (a spawned trainer pickles its plugins and callbacks)."""
    from lightning.fabric.plugins import CheckpointIO as LightningIO
    from lightning_fabric.plugins import CheckpointIO as PlIO

    a, b = classes_for("lightning"), classes_for("pytorch_lightning")
    assert issubclass(a.AtomicCheckpointIO, LightningIO)
    assert not issubclass(a.AtomicCheckpointIO, PlIO)
    assert issubclass(b.AtomicCheckpointIO, PlIO)
    assert issubclass(b.AtomicModelCheckpoint, pl_of("pytorch_lightning").callbacks.ModelCheckpoint)
    strategies = pl_of("pytorch_lightning").strategies
    assert issubclass(b.AtomicModelParallelStrategy, strategies.ModelParallelStrategy)
    assert issubclass(b.AtomicFSDPStrategy, strategies.FSDPStrategy)
    assert integration.AtomicCheckpointIO is a.AtomicCheckpointIO  # lightning is installed
    with pytest.raises(ValueError, match="package"):
        classes_for("torch")  # type: ignore[arg-type]
    for classes in (a, b):  # a spawned trainer pickles its plugins and callbacks
        io = classes.AtomicCheckpointIO(async_save=True)
        callback = classes.AtomicModelCheckpoint(dirpath=tmp_path, save_last="link")
        io2, callback2 = pickle.loads(pickle.dumps((io, callback)))
        assert type(io2) is classes.AtomicCheckpointIO
        assert io2.async_save
        assert type(callback2) is classes.AtomicModelCheckpoint


def test_an_untested_lightning_version_warns_and_builds_the_classes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Outside the tested range the classes are still built, with a warning that names
    the range and the private methods; a missing private method is refused."""
    lightning = importlib.import_module("lightning")
    monkeypatch.setattr(lightning, "__version__", "2.7.0")
    monkeypatch.setattr(integration, "_BUILT", {})
    with pytest.warns(UntestedVersionWarning) as caught:
        classes = classes_for("lightning")
    assert issubclass(classes.AtomicCheckpointIO, lightning.fabric.plugins.CheckpointIO)
    message = str(caught[0].message)
    assert "tested with lightning 2.3.0 to 2.6.x, and lightning 2.7.0 is installed" in message
    assert "ModelCheckpoint._link_checkpoint" in message
    assert "ModelParallelStrategy._save_distributed_checkpoint" in message

    monkeypatch.setattr(integration, "_BUILT", {})
    callbacks = importlib.import_module("lightning.pytorch.callbacks")
    monkeypatch.delattr(callbacks.ModelCheckpoint, "_link_checkpoint")
    with pytest.raises(ImportError, match=r"lacks ModelCheckpoint\._link_checkpoint"):
        classes_for("lightning")


def test_core_never_imports_lightning_and_the_integration_names_its_extra() -> None:
    """``import atomic_ckpt`` imports neither torch nor Lightning; without Lightning the
    integration fails at import with a one-line hint naming the extra."""
    code = (
        "import sys\n"
        "import atomic_ckpt\n"
        "assert not {'torch', 'lightning', 'pytorch_lightning'} & set(sys.modules)\n"
        "sys.modules['lightning'] = sys.modules['pytorch_lightning'] = None\n"
        "try:\n"
        "    import atomic_ckpt.integrations.lightning\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == (
        "atomic_ckpt.integrations.lightning needs Lightning: pip install 'atomic_ckpt[lightning]'"
    )
