"""The tiny LightningModule the in-process Lightning tests train (either package)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def tiny_model(pl: Any, optimizer: type[torch.optim.Optimizer] = torch.optim.SGD) -> Any:
    """A 4-8-1 MLP on 8 fixed samples, for ``pl`` (``lightning.pytorch`` or
    ``pytorch_lightning``), trained with ``optimizer`` at lr 0.1."""

    class Tiny(pl.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return optimizer(self.parameters(), lr=0.1)

        def train_dataloader(self) -> DataLoader[Any]:
            x = torch.arange(32, dtype=torch.float32).reshape(8, 4) / 32
            return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=2)

    return Tiny()
