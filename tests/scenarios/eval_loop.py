"""A validation pass after every epoch, the way most training scripts have one: not an input problem.

Modes (argv[1]): "plain" (batches of 16 from 200 samples: 12 x 16 + 8 per epoch), "accum" (gradient
accumulation: micro-batches of 8 from 192 samples, 2 per optimizer step), "ahead" (as plain, through a
loader that fetches one batch ahead, as accelerate does for Hugging Face Trainer). Each validation
pass is 4 batches of 32 under no_grad in eval(), about 6x a training step.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator

import torch
from healthy import GPU_TIME, model_and_optimizer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

EPOCHS = 4


def data(n: int, batch: int) -> DataLoader:
    return DataLoader(
        TensorDataset(torch.randn(n, 3, 16, 16), torch.randint(0, 10, (n,))), batch_size=batch
    )


def read_ahead(batches: Iterable) -> Iterator:
    """Yield each batch only once the next one is fetched (accelerate's DataLoaderShard)."""
    it = iter(batches)
    current = next(it)
    for following in it:
        yield current
        current = following
    yield current


def validate(model: nn.Module, val: DataLoader) -> None:
    model.eval()
    with torch.no_grad():
        for x, _ in val:
            model(x)
            time.sleep(GPU_TIME)
    model.train()


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "plain"
    model, opt = model_and_optimizer()
    accum = 2 if mode == "accum" else 1
    train = data(192, 8) if mode == "accum" else data(200, 16)
    val = data(128, 32)
    for _ in range(EPOCHS):
        batches = read_ahead(train) if mode == "ahead" else train
        for i, (x, y) in enumerate(batches):
            (nn.functional.cross_entropy(model(x), y) / accum).backward()
            time.sleep(GPU_TIME / accum)
            if (i + 1) % accum == 0:
                opt.step()
                opt.zero_grad()
        validate(model, val)


if __name__ == "__main__":
    main()
