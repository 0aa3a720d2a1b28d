"""Healthy: in-memory data, a small model, nothing in the way. No rule should fire.

The scenarios run on shared CPU-only machines: a short sleep per step stands in for the GPU's share of
a step, so that the time structure each scenario creates does not depend on how busy the cores are.
"""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

STEPS = 150
GPU_TIME = 0.02  # seconds per step that a GPU would spend


def model_and_optimizer() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 64), nn.ReLU(), nn.Linear(64, 10))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def train_step(
    model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
) -> None:
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    time.sleep(GPU_TIME)
    opt.step()


def in_memory(steps: int = STEPS, batch: int = 16) -> DataLoader:
    data = TensorDataset(
        torch.randn(steps * batch, 3, 16, 16), torch.randint(0, 10, (steps * batch,))
    )
    return DataLoader(data, batch_size=batch)


def main() -> None:
    model, opt = model_and_optimizer()
    for x, y in in_memory():
        train_step(model, opt, x, y)


if __name__ == "__main__":
    main()
