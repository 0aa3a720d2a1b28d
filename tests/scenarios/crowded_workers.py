"""CPU-bound in crowded loader workers: four per core, each with a heavy augmentation per sample.

Together they fill every core, so each gets a fraction of one: starved, not idle (waiting on storage).
"""

from __future__ import annotations

import os

from cpu_transform import HeavyAugment
from healthy import model_and_optimizer, train_step
from measured import timed
from torch.utils.data import DataLoader

STEPS = 80


def main() -> None:
    model, opt = model_and_optimizer()
    data = HeavyAugment(STEPS * 8)
    for x, y in timed(DataLoader(data, batch_size=8, num_workers=4 * (os.cpu_count() or 1))):
        train_step(model, opt, x, y)


if __name__ == "__main__":
    main()
