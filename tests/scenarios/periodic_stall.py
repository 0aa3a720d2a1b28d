"""Every 10th step writes a checkpoint and stalls (a slow disk, simulated by a sleep).

A plain CPU loop: unlike the other scenarios its steps are compute on torch's default threads, not
a sleep standing in for a GPU, so other load on the machine spreads their times widely (a core
taken from one of the threads holds up the others); the period must still be found.
"""

from __future__ import annotations

import os
import tempfile
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

EVERY = 10
STEPS = 150
STALL = 0.4  # seconds


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(STEPS * 64, 3, 32, 32), torch.randint(0, 10, (STEPS * 64,)))
    ckpt = os.path.join(tempfile.mkdtemp(), "ckpt.pt")
    for step, (x, y) in enumerate(DataLoader(data, batch_size=64)):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if step % EVERY == EVERY - 1:
            torch.save(model.state_dict(), ckpt)
            time.sleep(STALL)


if __name__ == "__main__":
    main()
