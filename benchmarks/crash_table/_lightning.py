"""The Lightning rows: a BoringModel-like module, ``ModelCheckpoint`` and ``ckpt_path="last"``.

Every fit saves each step as ``ckpt/step=<N>.ckpt`` and ``ckpt/last.ckpt``
(``save_top_k=-1``, ``save_last=True``, no version counter, so a step saved again is
written over). Save 1: a fresh fit of 1 step. Save 2: another fresh fit (another seed)
writes ``step=1.ckpt`` and ``last.ckpt`` again. Save 3: ``fit(ckpt_path="last")`` trains
to step 2 and saves it on a disk that fills up half-way through the file. The state a
save writes is digested in ``on_train_batch_end`` (before ``ModelCheckpoint``'s, which
Lightning runs last): the weights, the optimizer and the global step; the check digests
the same in ``on_train_start``, once ``fit(ckpt_path="last")`` has restored them.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

torch.set_num_threads(1)

from lightning.pytorch import Callback, LightningModule, Trainer  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import _common  # noqa: E402

warnings.filterwarnings("ignore", ".*does not have many workers.*")
warnings.filterwarnings("ignore", ".*no last checkpoint available.*")
warnings.filterwarnings("ignore", ".*exists and is not empty.*")


class Boring(LightningModule):
    """Lightning's BoringModel, with momentum so that the optimizer has state to save."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(32, 2)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    def train_dataloader(self) -> DataLoader[tuple[torch.Tensor, ...]]:
        x = torch.randn(16, 32, generator=torch.Generator().manual_seed(0))
        return DataLoader(TensorDataset(x), batch_size=4)


class Loaded(Exception):
    """Raised from ``on_train_start`` by the check: the digest of what resuming restored."""

    def __init__(self, digest: str) -> None:
        super().__init__(digest)
        self.digest = digest


def _state_digest(trainer: Trainer, module: LightningModule) -> str:
    return _common.digest(
        {
            "model": module.state_dict(),
            "optim": trainer.optimizers[0].state_dict(),
            "step": trainer.global_step,
        }
    )


class Journaled(Callback):
    """After each training step, before ModelCheckpoint saves it: record its digest."""

    def __init__(self, root: Path, save: int) -> None:
        self.root, self.save = root, save

    def on_train_batch_end(self, trainer: Trainer, module: LightningModule, *args: Any) -> None:
        _common.begin(self.root, self.save, _state_digest(trainer, module))


class Probe(Callback):
    """The check's callback: once ``fit`` has restored the checkpoint, report its digest."""

    def on_train_start(self, trainer: Trainer, module: LightningModule) -> None:
        raise Loaded(_state_digest(trainer, module))


def trainer(root: Path, steps: int, callback: Callback, plugins: list[Any]) -> Trainer:
    """A CPU Trainer of ``steps`` steps saving every step into ``root/ckpt``."""
    return Trainer(
        accelerator="cpu",
        max_steps=steps,
        default_root_dir=str(root / "ckpt"),
        plugins=plugins,
        callbacks=[
            callback,
            ModelCheckpoint(
                dirpath=str(root / "ckpt"),
                filename="{step}",
                every_n_train_steps=1,
                save_top_k=-1,
                save_last=True,
                enable_version_counter=False,
            ),
        ],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


def workload(root: Path, plugins: Any) -> None:
    """The three saves (module docstring); ``plugins()`` gives each Trainer its plugins.

    Temporary files go to ``root/tmp``: Lightning's own save writes each ``.ckpt`` to an
    fsspec temporary file (``tempfile.mkstemp``) and moves it into place, and the audit
    must see that file being written (a file moved in from outside the audited tree is
    refused, as it cannot be rebuilt). With ``/tmp`` on the checkpoints' filesystem,
    this is what happens anyway; on another one, the move is a copy.
    """
    _common.open_journal(root)
    (root / "tmp").mkdir()
    tempfile.tempdir = str(root / "tmp")
    for save in (1, 2):
        torch.manual_seed(save)
        trainer(root, 1, Journaled(root, save), plugins()).fit(Boring())
        _common.returned(root, save)
    torch.manual_seed(3)
    module = Boring()
    size = os.path.getsize(root / "ckpt" / "last.ckpt")
    third = trainer(root, 2, Journaled(root, 3), plugins())
    _common.failing_save(root, 3, size // 2, lambda: third.fit(module, ckpt_path="last"))


def check(root: Path, plugins: list[Any]) -> str:
    """``fit(ckpt_path="last")`` with ``plugins``; judge what it restored."""
    found = sorted((root / "ckpt").glob("last*.ckpt")) if (root / "ckpt").is_dir() else []
    if not found:  # fit(ckpt_path="last") would start fresh (Lightning warns and goes on)
        return _common.judge(root, None, "ckpt/")
    torch.manual_seed(3)
    try:
        trainer(root, 2, Probe(), plugins).fit(Boring(), ckpt_path="last")
    except Loaded as loaded:
        return _common.judge(root, loaded.digest, "last.ckpt")
    except Exception as exc:
        raise _common.Violation(f"cannot resume from last: {type(exc).__name__}: {exc}") from exc
    raise _common.Violation("fit(ckpt_path='last') never began training")
