"""A Lightning `Trainer.fit` as users write it, for phase checks: automatic optimization (argv[1]
"auto": Lightning steps the optimizer with a closure holding forward and backward) or manual
("manual": `manual_backward` and `opt.step()` in `training_step`); a validation pass per epoch."""

from __future__ import annotations

import sys
import time

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

MODE = sys.argv[1]


torch.set_num_threads(1)  # two of these share 2 cores in the tests: no OpenMP spinning


class Sleep(nn.Module):
    """Sleeps 5 ms in its forward: time any clock puts in forward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.005)
        return x


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(Sleep(), nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8))
        self.automatic_optimization = MODE == "auto"

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        if self.automatic_optimization:
            return loss
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        return None

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def loader(n: int) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(n, 64, generator=g), torch.randint(0, 8, (n,), generator=g))
    return DataLoader(data, batch_size=32)


trainer = pl.Trainer(
    max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
    enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
)  # fmt: skip
trainer.fit(Classifier(), loader(32 * 12), loader(32 * 3))
