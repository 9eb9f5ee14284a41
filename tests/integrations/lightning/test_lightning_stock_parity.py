"""``AtomicModelCheckpoint`` is interchangeable with the stock ``ModelCheckpoint`` where a
user or a tool can tell them apart: the checkpoint state (a run switching between them
resumes its best and top-k bookkeeping, both ways, with real fits), the signature, and a
``Mock()`` trainer in a unit test (linked as the stock callback links, not a hang). And the stock
callback's own ``last`` link, which ``AtomicCheckpointIO(async_save=True)`` cannot order,
is refused before it can dangle."""

from __future__ import annotations

import importlib
import inspect
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest.mock import Mock

import pytest

pytest.importorskip("torch", reason="needs the [torch] extra")
pytest.importorskip("lightning", reason="needs the [lightning] extra")
pytest.importorskip("pytorch_lightning", reason="needs pytorch-lightning (the test extra)")

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from atomic_ckpt.integrations.lightning import classes_for

PACKAGES = ["lightning", "pytorch_lightning"]


def pl_of(package: str) -> Any:
    return importlib.import_module("lightning.pytorch" if package == "lightning" else package)


def logging_model(pl: Any) -> Any:
    class Tiny(pl.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(4, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            self.log("loss", loss)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self) -> DataLoader[Any]:
            x = torch.arange(32, dtype=torch.float32).reshape(8, 4) / 32
            return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=2)

    return Tiny()


def fit(
    pl: Any,
    root: Path,
    callback: Any,
    steps: int,
    *,
    ckpt_path: str | None = None,
    plugins: list[Any] | None = None,
) -> Any:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        callbacks=[callback],
        plugins=plugins or [],
        default_root_dir=root,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(logging_model(pl), ckpt_path=ckpt_path)
    return trainer


def options(root: Path) -> dict[str, Any]:
    return {
        "dirpath": str(root / "ckpts"),
        "monitor": "loss",
        "save_top_k": 2,
        "every_n_train_steps": 1,
        "save_last": True,
    }


def bookkeeping(cb: Any) -> dict[str, Any]:
    return {
        "best_model_path": cb.best_model_path,
        "best_model_score": cb.best_model_score,
        "best_k_models": dict(cb.best_k_models),
        "kth_best_model_path": cb.kth_best_model_path,
        "last_model_path": cb.last_model_path,
    }


@pytest.mark.parametrize("package", PACKAGES)
@pytest.mark.parametrize("first", ["stock", "atomic"])
def test_state_resumes_across_a_switch_to_or_from_the_plugin(
    tmp_path: Path, package: str, first: str
) -> None:
    """Fit 4 steps with one callback, resume from last.ckpt with the other (the same
    arguments): the resumed callback holds the best path, score and top-k files the first
    one ended with, and the checkpoint files its state under ModelCheckpoint's key."""
    pl = pl_of(package)
    stock, atomic = pl.callbacks.ModelCheckpoint, classes_for(package).AtomicModelCheckpoint
    save_cls, resume_cls = (stock, atomic) if first == "stock" else (atomic, stock)
    saver = save_cls(**options(tmp_path))
    fit(pl, tmp_path, saver, steps=4)
    saved = bookkeeping(saver)
    assert len(saved["best_k_models"]) == 2
    last = tmp_path / "ckpts" / "last.ckpt"
    keys = list(torch.load(last, weights_only=False)["callbacks"])
    assert keys == [stock(**options(tmp_path)).state_key]
    assert keys[0].startswith("ModelCheckpoint{")

    resumer = resume_cls(**options(tmp_path))
    fit(pl, tmp_path, resumer, steps=4, ckpt_path=str(last))  # restores, trains no more
    assert bookkeeping(resumer) == saved


@pytest.mark.parametrize("package", PACKAGES)
def test_a_subclass_keeps_its_own_name_in_its_state_key(package: str) -> None:
    """As with ModelCheckpoint, a user's subclass of AtomicModelCheckpoint files its state
    under its own class name."""
    atomic = classes_for(package).AtomicModelCheckpoint

    class Mine(atomic):  # type: ignore[misc,valid-type]
        pass

    assert Mine(monitor="loss").state_key.startswith(f"{Mine.__qualname__}{{")
    assert (
        atomic(monitor="loss").state_key
        == pl_of(package).callbacks.ModelCheckpoint(monitor="loss").state_key
    )


@pytest.mark.parametrize("package", PACKAGES)
def test_signature_is_model_checkpoints(package: str) -> None:
    """inspect.signature (IDEs, docs, introspecting tools) shows ModelCheckpoint's
    parameters, defaults and annotations, not (*args, **kwargs)."""
    stock = pl_of(package).callbacks.ModelCheckpoint
    atomic = classes_for(package).AtomicModelCheckpoint
    assert inspect.signature(atomic) == inspect.signature(stock)
    assert "save_last" in inspect.signature(atomic).parameters
    atomic(dirpath="d", monitor="loss", save_top_k=3, save_last="link")  # it takes them


def test_a_mock_trainer_links_as_with_the_stock_callback_instead_of_hanging(
    tmp_path: Path,
) -> None:
    """_link_checkpoint with unittest.mock.Mock() as the trainer (whose checkpoint_io
    chain never ends) links as the stock callback does (Lightning's own tests call it so),
    with a warning naming the chain; in a child with a deadline, so that a hang fails the
    test instead of stalling the suite."""
    code = (
        "import os\n"
        "from unittest.mock import Mock\n"
        "from atomic_ckpt.integrations.lightning import AtomicModelCheckpoint\n"
        "open('a.ckpt', 'w').close()\n"
        "AtomicModelCheckpoint._link_checkpoint(Mock(), 'a.ckpt', 'last.ckpt')\n"
        "print('linked to', os.readlink('last.ckpt'))\n"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=90,
            check=True,
            cwd=tmp_path,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the CheckpointIO chain walk of a Mock trainer did not end")
    assert done.stdout.strip() == "linked to a.ckpt"
    assert "wraps more than 16 CheckpointIOs (Mock, Mock, Mock, ...)" in done.stderr
    assert "a Mock trainer?" in done.stderr


def ckpt_files(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


@pytest.mark.parametrize("package", PACKAGES)
@pytest.mark.parametrize("fresh", [True, False])
def test_async_plugin_refuses_the_stock_callbacks_last_link_before_its_first_save(
    tmp_path: Path, package: str, fresh: bool
) -> None:
    """AtomicCheckpointIO(async_save=True) with the stock ModelCheckpoint(save_last="link"),
    in a new directory (where the stock link crashed with FileNotFoundError) or an existing
    one (where last.ckpt named a file still queued): ValueError naming what to use, before
    anything is written."""
    pl = pl_of(package)
    io = classes_for(package).AtomicCheckpointIO(async_save=True)
    dirpath = tmp_path / "ckpts"
    if not fresh:
        dirpath.mkdir()
    stock = pl.callbacks.ModelCheckpoint(
        dirpath=dirpath, save_last="link", save_top_k=1, every_n_train_steps=1
    )
    with pytest.raises(ValueError, match=r"save_last='link'.*Use atomic_ckpt\.integrations"):
        fit(pl, tmp_path, stock, steps=3, plugins=[io])
    assert ckpt_files(dirpath) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_async_plugin_refuses_a_resume_with_the_stock_link_before_training(
    tmp_path: Path, package: str
) -> None:
    """Checkpoints saved synchronously, then a resumed fit with async_save=True and the
    stock linking callback: refused at the load, before a step is trained or a file
    changes."""
    pl = pl_of(package)
    classes = classes_for(package)
    dirpath = tmp_path / "ckpts"
    args = {"dirpath": dirpath, "save_last": "link", "save_top_k": 1, "every_n_train_steps": 1}
    fit(
        pl,
        tmp_path,
        pl.callbacks.ModelCheckpoint(**args),
        2,
        plugins=[classes.AtomicCheckpointIO()],
    )
    before = ckpt_files(dirpath)
    assert "last.ckpt" in before
    io = classes.AtomicCheckpointIO(async_save=True)
    last = str(dirpath / "last.ckpt")
    with pytest.raises(
        ValueError, match=r"cannot be used with ModelCheckpoint\(save_last='link'\)"
    ):
        fit(pl, tmp_path, pl.callbacks.ModelCheckpoint(**args), 4, ckpt_path=last, plugins=[io])
    assert ckpt_files(dirpath) == before


@pytest.mark.parametrize("package", PACKAGES)
def test_async_plugin_takes_the_stock_callback_when_it_does_not_link(
    tmp_path: Path, package: str
) -> None:
    """save_last=True (a copy, saved in order like any other) with the stock callback and
    async_save=True: no refusal, and last.ckpt is a real file of the last step."""
    pl = pl_of(package)
    io = classes_for(package).AtomicCheckpointIO(async_save=True)
    dirpath = tmp_path / "ckpts"
    stock = pl.callbacks.ModelCheckpoint(
        dirpath=dirpath, save_last=True, save_top_k=1, every_n_train_steps=1
    )
    fit(pl, tmp_path, stock, steps=3, plugins=[io])
    last = dirpath / "last.ckpt"
    assert not last.is_symlink()
    assert torch.load(last, weights_only=True)["global_step"] == 3


@pytest.mark.parametrize("through_io", [False, True])
def test_a_link_replaces_a_directory_at_last_as_the_stock_callback_does(
    tmp_path: Path, through_io: bool
) -> None:
    """A directory at the link's path (a sharded last.ckpt/ saved as a copy before the run
    switched to save_last="link"): the stock callback replaces it with the link, and so
    does this one, exchanged atomically (no instant without last), the old directory
    gone, with or without AtomicCheckpointIO."""
    pl = pl_of("lightning")
    classes = classes_for("lightning")
    target = tmp_path / "epoch=1.ckpt"
    target.mkdir()
    stock_link, link = tmp_path / "stock", tmp_path / "last.ckpt"
    for d in (stock_link, link):
        d.mkdir()
        (d / "shard").write_bytes(b"old")
    trainer = Mock() if not through_io else Mock(spec=["is_global_zero", "strategy"])
    if through_io:
        trainer.strategy = Mock(spec=["checkpoint_io", "barrier"])
        trainer.strategy.checkpoint_io = classes.AtomicCheckpointIO()
    pl.callbacks.ModelCheckpoint._link_checkpoint(trainer, str(target), str(stock_link))
    classes.AtomicModelCheckpoint._link_checkpoint(trainer, str(target), str(link))
    assert os.readlink(link) == os.readlink(stock_link) == "epoch=1.ckpt"
    assert sorted(os.listdir(tmp_path)) == ["epoch=1.ckpt", "last.ckpt", "stock"]


@pytest.mark.parametrize("errno_name", ["EPERM", "EOPNOTSUPP"])
@pytest.mark.parametrize("through_io", [False, True])
def test_where_symlinks_are_refused_last_is_an_atomic_copy_as_stock_falls_back_to(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    errno_name: str,
    through_io: bool,
) -> None:
    """On a filesystem that makes no symlinks (vfat, exFAT, some SMB mounts: symlink()
    fails with EPERM or EOPNOTSUPP), the stock callback copies the checkpoint to last.ckpt;
    so does this one, atomically (a temporary file renamed over it), saying so once, with
    or without AtomicCheckpointIO."""
    import errno as errno_module
    import logging

    pl = pl_of("lightning")
    classes = classes_for("lightning")
    code = getattr(errno_module, errno_name)
    refused: list[str] = []
    real_symlink = os.symlink

    def no_symlinks(target: Any, link: Any, *args: Any, **kwargs: Any) -> None:
        if str(tmp_path) in os.fspath(link):
            refused.append(os.fspath(link))
            raise OSError(code, os.strerror(code), os.fspath(link))
        real_symlink(target, link, *args, **kwargs)

    monkeypatch.setattr(os, "symlink", no_symlinks)
    for epoch in (1, 2):
        (tmp_path / f"epoch={epoch}.ckpt").write_bytes(b"weights %d" % epoch)
    trainer = Mock() if not through_io else Mock(spec=["is_global_zero", "strategy"])
    if through_io:
        trainer.strategy = Mock(spec=["checkpoint_io", "barrier"])
        trainer.strategy.checkpoint_io = classes.AtomicCheckpointIO()
    stock, ours = tmp_path / "stock.ckpt", tmp_path / "last.ckpt"
    with caplog.at_level(logging.WARNING):
        for epoch in (1, 2):
            target = str(tmp_path / f"epoch={epoch}.ckpt")
            pl.callbacks.ModelCheckpoint._link_checkpoint(trainer, target, str(stock))
            classes.AtomicModelCheckpoint._link_checkpoint(trainer, target, str(ours))
            if through_io:
                trainer.strategy.checkpoint_io.teardown()
            assert ours.read_bytes() == stock.read_bytes() == b"weights %d" % epoch
    assert refused, "the symlink refusal was never injected"
    assert not ours.is_symlink()
    assert caplog.text.count("refuses symlinks") == 1
    assert sorted(os.listdir(tmp_path)) == [
        "epoch=1.ckpt",
        "epoch=2.ckpt",
        "last.ckpt",
        "stock.ckpt",
    ]
