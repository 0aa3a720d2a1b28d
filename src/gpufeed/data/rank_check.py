"""The rank a Loader was made for against the process group it runs in.

A Loader splits its data by the rank it detected when made (torch.distributed, else RANK and
WORLD_SIZE). A trainer that starts its processes after the Loader was made (Lightning's
`Trainer(devices=N)` launcher), or a launcher that sets neither variable (srun), leaves it with
another rank than the one it trains on: every process would read a wrong share, silently, or the
ranks would run different numbers of steps and hang. `check_rank` refuses that when iterated.
"""

from __future__ import annotations

from gpufeed.errors import GpufeedError


class RankMismatch(GpufeedError, RuntimeError):
    """A Loader made for another rank or world size than the process group iterating it."""


def check_rank(rank: int, world_size: int) -> None:
    """Raise RankMismatch where torch.distributed runs with another rank or world size than
    (`rank`, `world_size`), the split a Loader detected when it was made."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    actual = dist.get_rank(), dist.get_world_size()
    if actual == (rank, world_size):
        return
    raise RankMismatch(
        f"gpufeed Loader: made for rank {rank} of {world_size} but iterated on rank {actual[0]} "
        f"of {actual[1]}: it took its rank from torch.distributed (else RANK and WORLD_SIZE) when "
        "made, before this process group began (e.g. under Lightning's Trainer(devices=N) or "
        "srun); make it in the *_dataloader() hook or a LightningDataModule, launch with "
        "torchrun, or pass rank= and world_size="
    )
