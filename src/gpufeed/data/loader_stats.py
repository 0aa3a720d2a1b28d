"""The Loader's books: the counts it keeps as batches are taken, the `stats()` report made of
them and of its stages, and the warning at a corrupt sample left out of its batch.

Apart from `loader` so that the Loader only wires the stages; these functions read its parts.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

import torch

from gpufeed.data.plan import Position
from gpufeed.data.ray_pool import RayPool
from gpufeed.text import visible


def new_stats() -> dict[str, Any]:
    """The counts of a new Loader."""
    return {
        "images": 0,
        "batches": 0,
        "seconds": 0.0,
        "wait_seconds": 0.0,
        "retried": 0,
        "first_batch_waits": [],
        "lent_batches": 0,  # of lenders closed; the current one counts its own
    }


def stats(loader: Any) -> dict[str, Any]:
    """`Loader.stats()`: its counts, with its settings, its stages' figures and memory bounds."""
    st = dict(loader._stats)
    st["first_batch_waits"] = list(st["first_batch_waits"])
    st["images_per_s"] = st["images"] / st["seconds"] if st["seconds"] else 0.0
    corrupt = loader._corrupt
    st["corrupt"] = len(corrupt)
    st["corrupt_samples"] = [{"shard": s, "key": k, "reason": r} for s, k, r in corrupt[:100]]
    st["preprocess"], st["preprocess_reason"] = loader.preprocess, loader.preprocess_reason
    st["prefetch"] = loader.prefetch
    st["num_workers"] = loader.num_workers
    st["cluster"] = loader.cluster
    if loader.cluster is not None:  # batches received from the cluster, actors lost
        pool = loader._pool if isinstance(loader._pool, RayPool) else None
        st["remote_bytes"] = pool.bytes_received if pool else 0
        st["remote_actors_lost"] = pool.actors_lost if pool else 0
    st["pinned"] = loader._pinned
    st["lent_batches"] += loader._lender.lent if loader._lender is not None else 0
    st["stage_seconds"] = dict(loader._stage.seconds) if loader._stage is not None else {}
    st["host_bytes_bound"] = loader.host_bytes_bound(loader.prefetch)
    st["max_host_bytes"] = loader.max_host_bytes
    st["device_bytes_bound"] = loader.device_bytes_bound()
    if loader.device.type == "cuda":
        st["device_max_allocated"] = torch.cuda.max_memory_allocated(loader.device)
    return st


def _outside_level() -> int:
    """The `stacklevel` of the first caller outside gpufeed and torch's DataLoader (the training
    loop that took the batch), for a warning that points there."""
    inside = (
        os.path.dirname(os.path.dirname(__file__)),
        os.path.dirname(torch.utils.data.__file__),
    )
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(inside):
        frame, level = frame.f_back, level + 1
    return level


def warn_corrupt(at: Position, corrupt: list[tuple[str, str, str]], kept: int, first: bool) -> None:
    """Say so at the `first` corrupt sample skipped, and at every batch left with none: the skip
    is otherwise seen only in `stats()`, and an empty batch reaches the training step."""
    shard, key, why = corrupt[0]
    where = visible(f"shard {shard}, key {key}: {why}")  # a key may hold ESC/OSC sequences
    if kept == 0:
        n = len(corrupt)
        what = "its 1 sample is corrupt" if n == 1 else f"all {n:,} of its samples are corrupt"
        warnings.warn(
            f"gpufeed Loader: batch {at.batch} of epoch {at.epoch} is empty: {what} "
            f"(the first: {where}); "
            "its loss will read NaN. Repack or remove the damaged images "
            "(loader.stats()['corrupt_samples'] lists them)",
            RuntimeWarning,
            stacklevel=_outside_level(),
        )
    elif first:
        warnings.warn(
            f"gpufeed Loader: left a corrupt sample out of its batch ({where}); later ones "
            "are left out without a warning and listed in loader.stats()['corrupt_samples'] "
            "(strict=True stops at the first instead)",
            RuntimeWarning,
            stacklevel=_outside_level(),
        )
