"""A loader-bound CPU loop for `--headspace`: each batch of 16 takes 24 ms to load (the dataset
sleeps 1.5 ms a sample, num_workers=0), each step about 10 ms of "compute" (a sleep in the
model's forward) and a little real work. argv[1]: "real" trains 6 epochs of 20 steps on the
DataLoader, "synthetic" the same number of steps on one batch; either writes its own median step
time (seconds, timed around each step with perf_counter; "real" leaves out the steps fed one batch
again, which it tells by the batch being the same object) to the JSON file argv[2]."""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

torch.set_num_threads(1)


class Slow(Dataset):
    def __len__(self) -> int:
        return 320

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        time.sleep(0.0015)
        return torch.full((3, 16, 16), float(i % 7)), i % 4


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(768, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.01)
        return self.net(x)


model = Model()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Slow(), batch_size=16)
one = next(iter(loader))


def batches():
    for _ in range(6):
        yield from (loader if sys.argv[1] == "real" else [one] * len(loader))


times, last = [], None
t0 = time.perf_counter()
for batch in batches():
    x, y = batch
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    t1 = time.perf_counter()
    if batch is not last or sys.argv[1] == "synthetic":
        times.append(t1 - t0)
    last, t0 = batch, t1
times = times[10:]  # warm-up, as the analysis leaves it out
with open(sys.argv[2], "w") as f:
    json.dump({"median_step": statistics.median(times), "steps": len(times)}, f)
