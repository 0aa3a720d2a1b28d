"""Two DDP ranks (torchrun, gloo): rank 1 reads its samples from slow storage, rank 0 does not."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from healthy import GPU_TIME
from torch import nn
from torch.utils.data import DataLoader, Dataset

STEPS = 60


class Shard(Dataset):
    def __init__(self, delay: float) -> None:
        self.delay = delay

    def __len__(self) -> int:
        return STEPS * 8

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.delay)
        return torch.randn(64), i % 4


def main() -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank = dist.get_rank()
    model = nn.parallel.DistributedDataParallel(nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in DataLoader(Shard(0.005 if rank == 1 else 0.0), batch_size=8):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        time.sleep(GPU_TIME)
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
