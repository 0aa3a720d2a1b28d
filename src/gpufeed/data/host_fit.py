"""Fitting a Loader's host buffers into `max_host_bytes`: the deepest prefetch that fits, found
in a few steps whatever prefetch was asked, and, where nothing fits, an error that names the
option holding most of the memory and the values of it that would fit."""

from __future__ import annotations

from collections.abc import Callable

from gpufeed.data.budget import host_bytes, machine_memory
from gpufeed.data.dataset import ShardDataset
from gpufeed.data.spec import BatchSpec
from gpufeed.errors import OptionError
from gpufeed.text import count

MIN_CHUNK = 64 * 1024  # the least chunk_size a Source reads in


def deepest(fits: Callable[[int], bool], asked: int) -> int:
    """The largest p in 1..`asked` with `fits(p)`, where `fits` holds up to some p and not
    beyond (memory grows with p); 1 if none fits. About log2(asked) calls."""
    if fits(asked):
        return asked
    lo, hi = 1, asked  # fits(hi) is False; fits(lo) is assumed, checked by the caller
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def too_small(
    cap: int, spec: BatchSpec, dataset: ShardDataset, workers: int, slots_per_worker: int
) -> OptionError:
    """The error for a `max_host_bytes` that even the least buffers exceed: what needs the
    memory, part by part, and what to pass, for the part that needs the most."""
    nw = max(1, workers)
    need = host_bytes(spec, dataset, workers, slots_per_worker)
    src = dataset.source
    slots = nw * slots_per_worker * spec.slot_bytes
    image = dataset.max_sample_bytes()
    shuffle = nw * dataset.shuffle_buffer * image
    ahead = need - slots - shuffle  # remote shards: chunks read ahead
    parts = [
        f"{slots:,} for slots of batches of {spec.slot_bytes:,} bytes",
        f"{shuffle:,} for shuffle_buffer={dataset.shuffle_buffer} images of up to {image:,}",
    ]
    if ahead > 0:
        parts.append(
            f"{ahead:,} for remote reads: read_ahead={src.read_ahead} chunks, and 2 more being "
            f"read, of chunk_size={src.chunk_size:,} bytes per worker"
        )
    machine = machine_memory()
    raise_cap = f"max_host_bytes={need} (this machine has {machine:,})"
    if ahead > max(slots, shuffle):
        room = cap - slots - shuffle
        fit_ahead = room // (nw * src.chunk_size) - 2
        fit_chunk = room // (nw * (src.read_ahead + 2))
        fits = []
        if fit_ahead >= 0:
            fits.append(f"read_ahead from 0 to {fit_ahead} (a whole number; the default is 2)")
        if fit_chunk >= MIN_CHUNK:
            fits.append(f"chunk_size up to {fit_chunk:,} bytes (the default is {8 << 20:,})")
        fix = (
            "each worker holds read_ahead + 2 chunks of chunk_size bytes of a remote shard: pass "
            + (" or ".join(fits) if fits else "a smaller read_ahead and chunk_size")
        )
    elif shuffle > slots:
        fit = (cap - slots - ahead) // (nw * image)
        fix = (
            f"pass shuffle_buffer from 1 to {fit}, or fewer num_workers"
            if fit >= 1
            else "pass a smaller shuffle_buffer, or fewer num_workers"
        )
    else:
        fix = "lower batch_size or num_workers"
    fix += f"; or pass {raise_cap}" if need <= machine else ""
    return OptionError(
        f"max_host_bytes={cap:,} is too small: {count(nw, 'worker')} need at least "
        f"{need:,} bytes ({'; '.join(parts)}). To fit, {fix}"
    )
