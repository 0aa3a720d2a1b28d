"""A small, plain PyTorch training script: a tiny CNN on a synthetic in-memory dataset.

Nothing in it knows about gpufeed. Profile it with:

    gpufeed profile -- python examples/train_small.py --workers 2 --sleep 0.01

`--sleep` makes every dataset item sleep, so that the job becomes input-bound on purpose.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SyntheticImages(Dataset):
    """Random 3x32x32 images with 10 classes, generated once; each item can sleep to mimic slow I/O."""

    def __init__(self, size: int, sleep: float, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.images = torch.randn(size, 3, 32, 32, generator=g)
        self.labels = torch.randint(0, 10, (size,), generator=g)
        self.sleep = sleep

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.sleep:
            time.sleep(self.sleep)
        return self.images[i], self.labels[i]


def tiny_cnn() -> nn.Module:
    """Two conv blocks and a linear head."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 8 * 8, 10),
    )


def main() -> None:
    """Train for --steps optimizer steps and print the throughput."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=150, help="optimizer steps to run")
    ap.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--sleep", type=float, default=0.0, help="seconds each dataset item sleeps")
    ap.add_argument("--dataset-size", type=int, default=2048)
    args = ap.parse_args()

    torch.manual_seed(0)
    data = SyntheticImages(args.dataset_size, args.sleep)
    loader = DataLoader(
        data,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        persistent_workers=args.workers > 0,
        drop_last=True,
    )
    model = tiny_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    step, t0 = 0, time.perf_counter()
    while step < args.steps:
        for images, labels in loader:
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(images), labels)
            loss.backward()
            opt.step()
            step += 1
            if step >= args.steps:
                break
    elapsed = time.perf_counter() - t0
    print(
        f"trained {step} steps in {elapsed:.1f} s: {step * args.batch_size / elapsed:.0f} samples/s, "
        f"last loss {loss.item():.3f}"
    )


if __name__ == "__main__":
    main()
