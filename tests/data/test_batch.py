"""Building one batch: per-image (CPU) and batched (GPU) schedules agree; output buffers are reused safely."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gpufeed.data.augment import Augment
from gpufeed.data.batch import SharedBatchBuffers, batch_generator, build_batch
from gpufeed.data.dataset import ShardDataset


@pytest.mark.parametrize(
    ("load", "dtype"), [(0, torch.float32), (3, torch.float32), (2, torch.uint8)]
)
def test_per_image_and_batched_schedules_give_the_same_batch(
    shards: Path, load: int, dtype: torch.dtype
):
    samples = list(ShardDataset(shards, shuffle=False).iter_worker(0, 1))[:8]
    aug = Augment(size=(32, 32), load=load)
    out = {}
    for per_image in (True, False):
        images, _, corrupt = build_batch(
            samples,
            aug,
            batch_generator(0, 0, 0, 0, 0),
            dtype=dtype,
            channels_last=per_image,  # also: the memory format does not change the values
            strict=True,
            per_image=per_image,
        )
        assert images.shape == (8, 3, 32, 32) and images.dtype == dtype and not corrupt
        out[per_image] = images
    torch.testing.assert_close(
        out[True], out[False], atol=1e-4 if dtype.is_floating_point else 1, rtol=0
    )


class _Worker(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """Batch i filled with i, in buffers from `buffers` (the last batch is smaller)."""

    def __init__(self, buffers: SharedBatchBuffers, n: int) -> None:
        self.buffers, self.n = buffers, n

    def __iter__(self):
        for i in range(self.n):
            shape = (2 if i < self.n - 1 else 1, 3, 4, 4)
            x, slot, reused = self.buffers.take(0, shape, torch.float32, False, capacity=96)
            yield x.fill_(i), slot, reused


def test_a_buffer_returns_to_its_worker_only_when_nothing_references_it():
    """A real worker process; the main side holds a view of batch 0 for the whole run."""
    buffers = SharedBatchBuffers(workers=1, slots=4)
    dl = torch.utils.data.DataLoader(
        _Worker(buffers, 20), batch_size=None, num_workers=1, prefetch_factor=1
    )
    kept, reused = None, []
    for i, (x, slot, was_reused) in enumerate(dl):
        buffers.release_unused()
        buffers.hold(0, slot, x)
        assert torch.all(x == i) and x.shape[0] == (2 if i < 19 else 1)
        reused.append(was_reused)
        if i == 0:
            kept = x[1]  # a view keeps the whole buffer taken
    assert kept is not None and torch.all(kept == 0)
    assert sum(reused) >= 10  # the other three slots go round


def test_with_every_slot_taken_the_worker_takes_a_fresh_batch():
    buffers = SharedBatchBuffers(workers=2, slots=2)
    got = [buffers.take(1, (2, 3, 4, 4), torch.float32, True, capacity=96) for _ in range(3)]
    assert [(slot, reused) for _, slot, reused in got] == [(0, False), (1, False), (-1, False)]
    assert all(x.is_shared() for x, _, _ in got)
    assert got[0][0].is_contiguous(memory_format=torch.channels_last)


def test_reclaim_frees_only_undelivered_slots_of_earlier_iterations():
    buffers = SharedBatchBuffers(workers=1, slots=3)
    shape = (2, 3, 4, 4)
    delivered, slot, _ = buffers.take(0, shape, torch.float32, False, capacity=96, tag=1)
    buffers.hold(0, slot, delivered)  # still held by the training loop
    buffers.take(0, shape, torch.float32, False, capacity=96, tag=1)  # made, never delivered
    buffers.take(0, shape, torch.float32, False, capacity=96, tag=2)  # the new iteration's
    buffers.reclaim(2)
    assert buffers.in_use[0].tolist() == [1, 0, 2]
