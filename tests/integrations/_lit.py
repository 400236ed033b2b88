"""A tiny LightningModule (Linear + BatchNorm, Adam or the optimizer a test makes) on random data, for either
Lightning package."""

from __future__ import annotations

from typing import Any

import torch


def module_class(pl: Any) -> type:
    """The LightningModule class of package ``pl`` (``lightning.pytorch`` or ``pytorch_lightning``)."""

    class Tiny(pl.LightningModule):
        def __init__(self, fail_at: int | None = None, optimizer: Any = None) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(),
                                           torch.nn.Linear(32, 1))
            self.fail_at = fail_at
            self.make_optimizer = optimizer or (lambda params: torch.optim.Adam(params, lr=1e-3))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            if self.fail_at is not None and self.global_step == self.fail_at:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (test)")
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return self.make_optimizer(self.parameters())

        def train_dataloader(self) -> torch.utils.data.DataLoader:
            g = torch.Generator().manual_seed(0)
            data = torch.utils.data.TensorDataset(torch.randn(96, 8, generator=g), torch.randn(96, 1, generator=g))
            return torch.utils.data.DataLoader(data, batch_size=8)

    return Tiny
