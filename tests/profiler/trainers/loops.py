"""Plain PyTorch training loops as users write them, one per mode (argv[1]), for phase checks:
closure (SGD stepped with a closure), lbfgs, accumulate (4 micro-batches per step), gan (two models,
two optimizers per step), amp (autocast + GradScaler), compile (torch.compile), ddp (under torchrun).
Each runs 24 optimizer steps of a small MLP on a DataLoader with no workers; every model call
sleeps a few ms inside its forward (the generator's longer), a mark the phases must put in forward."""

from __future__ import annotations

import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

MODE = sys.argv[1]
STEPS = 24
torch.manual_seed(0)
torch.set_num_threads(1)  # two of these share 2 cores in the tests: no OpenMP spinning


class Sleep(nn.Module):
    """Sleeps `seconds` in its forward: time any clock puts in forward."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.seconds)
        return x


def mlp(n_in: int = 64, n_out: int = 8, sleep: float = 0.005) -> nn.Module:
    return nn.Sequential(Sleep(sleep), nn.Linear(n_in, 256), nn.ReLU(), nn.Linear(256, n_out))


def batches(micro: int = 1) -> DataLoader:
    n = 32 * STEPS * micro
    return DataLoader(TensorDataset(torch.randn(n, 64), torch.randint(0, 8, (n,))), batch_size=32)


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(x), y)


if MODE in ("closure", "lbfgs"):
    model = mlp()
    opt = (
        torch.optim.LBFGS(model.parameters(), max_iter=3)
        if MODE == "lbfgs"
        else torch.optim.SGD(model.parameters(), lr=0.01)
    )
    for x, y in batches():

        def closure(x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
            opt.zero_grad()
            loss = loss_of(model, x, y)
            loss.backward()
            return loss

        opt.step(closure)

elif MODE == "accumulate":
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i, (x, y) in enumerate(batches(micro=4)):
        (loss_of(model, x, y) / 4).backward()
        if i % 4 == 3:
            opt.step()
            opt.zero_grad()

elif MODE == "gan":
    gen, disc = mlp(16, 64, sleep=0.02), mlp(64, 1, sleep=0.002)
    opt_d = torch.optim.Adam(disc.parameters(), lr=1e-4)
    opt_g = torch.optim.Adam(gen.parameters(), lr=1e-4)
    bce = nn.functional.binary_cross_entropy_with_logits
    for real, _ in batches():
        fake = gen(torch.randn(len(real), 16))
        ones, zeros = torch.ones(len(real), 1), torch.zeros(len(real), 1)
        d_loss = bce(disc(real), ones) + bce(disc(fake.detach()), zeros)
        opt_d.zero_grad()
        d_loss.backward()
        opt_d.step()
        g_loss = bce(disc(fake), ones)
        opt_g.zero_grad()
        g_loss.backward()
        opt_g.step()

elif MODE == "amp":
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")
    for x, y in batches():
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = loss_of(model, x, y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

elif MODE == "compile":
    model = mlp()
    compiled = torch.compile(model, backend="aot_eager")  # AOTAutograd's graphs, no C++ build
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in batches():
        opt.zero_grad()
        loss_of(compiled, x, y).backward()
        opt.step()

elif MODE == "ddp":
    import torch.distributed as dist

    dist.init_process_group("gloo")
    model = nn.parallel.DistributedDataParallel(mlp())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in batches():
        opt.zero_grad()
        loss_of(model, x, y).backward()
        opt.step()
    dist.destroy_process_group()

else:
    sys.exit(f"unknown mode {MODE!r}")
print(f"{MODE}: done in pid {os.getpid()}")
