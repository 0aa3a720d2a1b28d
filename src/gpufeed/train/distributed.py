"""Join the process group that `torchrun` describes in the environment: gloo on CPU, NCCL on GPU."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job: its rank, the world size and the device it trains on."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str | None

    @property
    def is_main(self) -> bool:
        """True on the process that logs and writes results (rank 0)."""
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


def pick_backend(gpus: int, local_ranks: int) -> str:
    """``nccl`` when every local rank has a GPU of its own, else ``gloo``."""
    return "nccl" if gpus >= local_ranks >= 1 else "gloo"


def setup_distributed(backend: str | None = None) -> DistInfo:
    """Initialise DDP when launched by torchrun (WORLD_SIZE > 1); a plain single process otherwise.

    Picks ``nccl`` with one GPU per local rank when CUDA is available, else ``gloo`` (on the CPU,
    or on GPUs shared by several local ranks, which NCCL refuses: "Duplicate GPU detected").
    """
    world_size = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", 0)
    cuda = torch.cuda.is_available()
    if cuda:
        device = torch.device("cuda", local_rank % max(torch.cuda.device_count(), 1))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world_size <= 1:
        return DistInfo(0, 0, 1, device, None)
    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(k)]
    if missing and not dist.is_initialized():
        raise RuntimeError(
            f"WORLD_SIZE={world_size} but {' and '.join(missing)} not set: launch with "
            "`torchrun --nproc_per_node N script.py` (it sets them), or unset WORLD_SIZE"
        )
    gpus = torch.cuda.device_count() if cuda else 0
    backend = backend or pick_backend(gpus, _env_int("LOCAL_WORLD_SIZE", world_size))
    if not dist.is_initialized():
        kwargs = {"device_id": device} if backend == "nccl" else {}
        dist.init_process_group(backend, rank=rank, world_size=world_size, **kwargs)
    return DistInfo(rank, local_rank, world_size, device, dist.get_backend())


def cleanup_distributed() -> None:
    """Leave the process group, if this process joined one."""
    if dist.is_available() and dist.is_initialized():
        # every rank done with its last collective first: gloo's threads torn down under a peer
        # still talking abort the process ("terminate called without an active exception")
        with contextlib.suppress(Exception):
            dist.barrier()
        dist.destroy_process_group()
