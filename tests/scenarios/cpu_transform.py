"""CPU-bound in the training process: a heavy augmentation per sample with num_workers=0."""

from __future__ import annotations

import torch
from healthy import model_and_optimizer, train_step
from measured import timed
from torch import nn
from torch.utils.data import DataLoader, Dataset

STEPS = 40
# ~160 ms of loading per step, well over the 0.1-s sampling interval: samples that hold a step's
# compute and samples that do not tell loading from computing (at ~1 interval per step they cannot)
BATCH = 16


class HeavyAugment(Dataset):
    def __init__(self, samples: int = STEPS * BATCH) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        x = torch.randn(3, 128, 128)
        for _ in range(12):  # repeated blur + flip, the kind of augmentation stack that eats a core
            x = nn.functional.avg_pool2d(x.unsqueeze(0), 5, 1, 2).squeeze(0).flip(-1)
        return x[:, ::8, ::8].contiguous(), i % 10


def main() -> None:
    model, opt = model_and_optimizer()
    for x, y in timed(DataLoader(HeavyAugment(), batch_size=BATCH, num_workers=0)):
        train_step(model, opt, x, y)


if __name__ == "__main__":
    main()
