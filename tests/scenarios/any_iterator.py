"""Input-bound without a DataLoader: every batch takes 30 ms to 'read' (a sleep, like slow storage).

Modes (argv[1]): "generator" (a plain generator feeds the loop, as DALI, FFCV or a custom
prefetcher would), "get_batch" (nanoGPT: random slices of a token tensor, the next batch fetched
between forward and backward), "no_module" (a bare tensor model, no nn.Module: what feeds the step
cannot be told apart from the step, so data wait is unknown).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

import torch
from healthy import GPU_TIME
from torch import nn

STEPS = 40
READ = 0.03  # seconds to fetch one batch
TOKENS = torch.randint(0, 64, (10_000,))


def get_batch(block: int = 8, batch: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    time.sleep(READ)
    ix = torch.randint(len(TOKENS) - block - 1, (batch,))
    x = torch.stack([TOKENS[i : i + block] for i in ix])
    return x, TOKENS[ix + block]


def generator() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for _ in range(STEPS):
        yield get_batch()


def main() -> None:
    mode = sys.argv[1]
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Embedding(64, 16), nn.Flatten(), nn.Linear(16 * 8, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if mode == "generator":
        for x, y in generator():
            nn.functional.cross_entropy(model(x), y).backward()
            time.sleep(GPU_TIME)
            opt.step()
            opt.zero_grad(set_to_none=True)
    elif mode == "get_batch":
        x, y = get_batch()
        for _ in range(STEPS):
            loss = nn.functional.cross_entropy(model(x), y)
            x, y = get_batch()  # nanoGPT fetches the next batch while the GPU computes
            loss.backward()
            time.sleep(GPU_TIME)
            opt.step()
            opt.zero_grad(set_to_none=True)
    else:
        w = torch.zeros(8, 64, requires_grad=True)
        opt = torch.optim.SGD([w], lr=0.01)
        for x, y in generator():
            nn.functional.cross_entropy(x.float() @ w, y).backward()
            time.sleep(GPU_TIME)
            opt.step()
            opt.zero_grad(set_to_none=True)


if __name__ == "__main__":
    main()
