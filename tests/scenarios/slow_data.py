"""Input-bound: each sample takes 8 ms to 'read' (a sleep, like slow storage); one worker fetches them."""

from __future__ import annotations

import time

import torch
from healthy import model_and_optimizer, train_step
from measured import timed
from torch.utils.data import DataLoader, Dataset

STEPS = 60


class SlowStorage(Dataset):
    def __len__(self) -> int:
        return STEPS * 8

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        time.sleep(0.008)
        return torch.randn(3, 16, 16), i % 10


def main(num_workers: int = 1) -> None:
    model, opt = model_and_optimizer()
    for x, y in timed(DataLoader(SlowStorage(), batch_size=8, num_workers=num_workers)):
        train_step(model, opt, x, y)


if __name__ == "__main__":
    main()
