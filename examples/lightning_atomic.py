"""Lightning with atomic, durable checkpoints: run it, kill it (Ctrl-C, kill -9), run it again.

pip install 'atomic_ckpt[lightning]'
python examples/lightning_atomic.py            # trains 5 epochs, resumes if killed
"""

from __future__ import annotations

import sys

import torch
from lightning.pytorch import LightningModule, Trainer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from atomic_ckpt.integrations.lightning import AtomicCheckpointIO, AtomicModelCheckpoint


class Regressor(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    def train_dataloader(self) -> DataLoader[tuple[torch.Tensor, ...]]:
        x = torch.randn(256, 8, generator=torch.Generator().manual_seed(0))
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True).sin()), batch_size=32)


def main(root: str = "lightning_run") -> None:
    trainer = Trainer(
        accelerator="cpu",
        max_epochs=5,
        default_root_dir=root,
        # Atomic + durable .ckpt files, written in the background, in order.
        plugins=[AtomicCheckpointIO(async_save=True)],
        # Top-2 by step, and a `last.ckpt` link that is never absent and never dangles.
        callbacks=[
            AtomicModelCheckpoint(
                dirpath=f"{root}/checkpoints",
                monitor="step",
                mode="max",
                save_top_k=2,
                save_last="link",
                enable_version_counter=False,
            )
        ],
        logger=False,
        enable_progress_bar=False,
    )
    trainer.fit(Regressor(), ckpt_path="last")  # resumes if a checkpoint exists


if __name__ == "__main__":
    main(*sys.argv[1:])
