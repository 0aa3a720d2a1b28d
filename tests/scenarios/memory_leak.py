"""A growing tensor list: 4 MB of every batch's activations are kept 'for later analysis'."""

from __future__ import annotations

import torch
from healthy import in_memory, model_and_optimizer, train_step


def main() -> None:
    model, opt = model_and_optimizer()
    kept = []
    for x, y in in_memory():
        train_step(model, opt, x, y)
        kept.append(torch.ones(1024, 1024))  # 4 MB per step, never released


if __name__ == "__main__":
    main()
