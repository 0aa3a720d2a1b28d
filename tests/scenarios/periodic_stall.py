"""Every 10th step writes a checkpoint and stalls (a slow disk, simulated by a sleep)."""

from __future__ import annotations

import os
import tempfile
import time

import torch
from healthy import in_memory, model_and_optimizer, train_step

EVERY = 10


def main() -> None:
    model, opt = model_and_optimizer()
    ckpt = os.path.join(tempfile.mkdtemp(), "ckpt.pt")
    for step, (x, y) in enumerate(in_memory()):
        train_step(model, opt, x, y)
        if step % EVERY == EVERY - 1:
            torch.save(model.state_dict(), ckpt)
            time.sleep(0.4)


if __name__ == "__main__":
    main()
