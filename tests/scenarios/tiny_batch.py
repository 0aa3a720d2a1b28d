"""A tiny batch: 2 samples a step, each step a millisecond or two, nothing in the way of the data.

On a GPU, BatchSize names it (the GPU mostly idle, its memory mostly free); a CPU-only run records
no GPU utilization or memory, so no rule fires. Its short steps are the most exposed to other load
on the machine (a few ms of waiting for a core is several times a step): neither stray slow steps
nor a period may come of that.
"""

from __future__ import annotations

import time

from healthy import in_memory, model_and_optimizer
from torch import nn

STEPS = 1000
GPU_TIME = 0.001  # seconds per step that a GPU would spend on 2 samples


def main() -> None:
    model, opt = model_and_optimizer()
    for x, y in in_memory(STEPS, batch=2):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        time.sleep(GPU_TIME)
        opt.step()


if __name__ == "__main__":
    main()
