"""One training loop for `verdict_accuracy.py`, shaped by its options into each scenario.

A sample costs `--read-ms` of sleep (storage, latency) and `--cpu-ms` of pure-Python work (decode,
augmentation) in `__getitem__`; a step costs `--compute-ms` of sleep in the model's forward (a GPU
working while the host waits, as `time.sleep` releases the GIL) and a small real MLP; every
`--stall-every` steps the loop sleeps `--stall-ms` after its optimizer step (a checkpoint). The
loop times itself: samples per second over the steps after `--warmup`, leaving out the steps fed
one batch again (`gpufeed profile --headspace`, told by the batch being the same object), written
as JSON to `--out`.

Run: python benchmarks/verdict_loop.py --steps 80 --batch 16 --workers 1 --read-ms 2 --out r.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


def options() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--read-ms", type=float, default=0.0)
    ap.add_argument("--cpu-ms", type=float, default=0.0)
    ap.add_argument("--compute-ms", type=float, default=10.0)
    ap.add_argument("--stall-every", type=int, default=0)
    ap.add_argument("--stall-ms", type=float, default=0.0)
    ap.add_argument("--out", required=True)
    return ap.parse_args()


class Samples(Dataset):
    """`n` small images, each costing `read_ms` asleep and `cpu_ms` on a CPU to make."""

    def __init__(self, n: int, read_ms: float, cpu_ms: float) -> None:
        self.n, self.read, self.cpu = n, read_ms / 1e3, cpu_ms / 1e3

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self.read:
            time.sleep(self.read)
        if self.cpu:
            end = time.thread_time() + self.cpu
            x = 0
            while time.thread_time() < end:
                x += 1
        return torch.full((3, 16, 16), float(i % 5)), i % 4


class Model(nn.Module):
    def __init__(self, compute_ms: float) -> None:
        super().__init__()
        self.compute = compute_ms / 1e3
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(768, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.compute)
        return self.net(x)


def main() -> None:
    o = options()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Model(o.compute_ms)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = Samples(o.steps * o.batch, o.read_ms, o.cpu_ms)
    loader = DataLoader(data, batch_size=o.batch, num_workers=o.workers)
    timed, samples, last = 0.0, 0, None
    t0 = time.perf_counter()
    for step, (x, y) in enumerate(loader):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if o.stall_every and step % o.stall_every == o.stall_every - 1:
            time.sleep(o.stall_ms / 1e3)
        t1 = time.perf_counter()
        if step >= o.warmup and x is not last:
            timed, samples = timed + (t1 - t0), samples + len(x)
        last, t0 = x, t1
    with open(o.out, "w") as f:
        json.dump({"samples_per_s": samples / timed, "samples": samples, "seconds": timed}, f)


if __name__ == "__main__":
    main()
