"""Building one batch: the per-image (CPU) and batched (GPU) schedules agree; random parameters
are keyed by the batch's index in the epoch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gpufeed.data.augment import Augment
from gpufeed.data.batch import batch_generator, build_batch
from gpufeed.data.dataset import ShardDataset


@pytest.mark.parametrize(
    ("load", "dtype"), [(0, torch.float32), (3, torch.float32), (2, torch.uint8)]
)
def test_per_image_and_batched_schedules_give_the_same_batch(
    shards: Path, load: int, dtype: torch.dtype
):
    samples = list(ShardDataset(shards, shuffle=False).iter_worker(0, 1))[:8]
    aug = Augment.load_factor(load, size=(32, 32))
    out = {}
    for per_image in (True, False):
        images, _, corrupt = build_batch(
            samples,
            aug,
            batch_generator(0, 0, 0, 0),
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


def test_batch_generator_is_keyed_by_seed_epoch_rank_and_batch_index():
    def draw(*key: int) -> torch.Tensor:
        return torch.rand(4, generator=batch_generator(*key))

    assert torch.equal(draw(1, 2, 0, 5), draw(1, 2, 0, 5))
    base = draw(1, 2, 0, 5)
    for other in [(2, 2, 0, 5), (1, 3, 0, 5), (1, 2, 1, 5), (1, 2, 0, 6)]:
        assert not torch.equal(base, draw(*other)), other
