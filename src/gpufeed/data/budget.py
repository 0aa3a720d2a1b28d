"""Host resources of a loader: what its slots and read buffers hold at most, against a memory
cap sized from the machine."""

from __future__ import annotations

import os

from gpufeed.data.dataset import ShardDataset
from gpufeed.data.spec import BatchSpec

DEFAULT_SHARE = 0.25  # of the machine's memory, when the user sets no cap


def machine_memory() -> int:
    """The memory this process may use in bytes: the machine's, capped by its container's limit
    (a 64 GiB pod on a 1 TiB node has 64 GiB)."""
    from gpufeed.cores import memory_limit

    try:
        import psutil

        total = int(psutil.virtual_memory().total)
    except Exception:
        total = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    limit = memory_limit()
    return min(total, limit) if limit else total


def default_max_host_bytes() -> int:
    """The cap used when none is given: a quarter of the machine's memory."""
    return int(machine_memory() * DEFAULT_SHARE)


def host_bytes(spec: BatchSpec, dataset: ShardDataset, workers: int, slots_per_worker: int) -> int:
    """Most host memory the loader's buffers hold: every slot, plus per worker its shuffle buffer
    of encoded images and, for remote shards, its read-ahead chunks."""
    nw = max(1, workers)
    per_worker = dataset.shuffle_buffer * dataset.max_sample_bytes()
    src = dataset.source
    if src.remote:
        per_worker += (src.read_ahead + 2) * src.chunk_size
    return nw * (per_worker + slots_per_worker * spec.slot_bytes)
