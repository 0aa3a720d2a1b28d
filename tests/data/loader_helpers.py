"""Shared by the Loader specifications (test_loader_*.py): augmentations, tolerances and ways of
reading a loader's epochs, and the CPU path's batches to compare them with. The `make` fixture is in
conftest.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from gpufeed.data import jpeg_region
from gpufeed.data.augment import Augment
from gpufeed.data.batch import batch_generator, build_batch
from gpufeed.data.dataset import RawSample, ShardDataset
from gpufeed.data.decoders import DECODER_NAMES
from gpufeed.data.loader import Loader
from gpufeed.data.plan import BatchPlan, Position

SMALL = Augment(size=(16, 16))
AUG = Augment.load_factor(2, size=(32, 32))
# uint8 hand-off rounds each pixel (±0.5 of 255) before normalization
UINT8_TOL = 0.5 / 255 / min(AUG.std) + 1e-4
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

MakeLoader = Callable[..., Loader]


def workers_decoder_name(aug: Augment = SMALL) -> str:
    """What stats() names the CPU workers' decoder for `aug`: one native pass where the CPU runs
    its vectorized resize and the load block only flips, crop regions where gpufeed's decoder of
    them was built, else whole JPEGs."""
    if jpeg_region.one_pass_available() and (aug.degrees == 0 or not aug.train):
        return DECODER_NAMES["workers-one-pass"]
    return DECODER_NAMES["workers-regions" if jpeg_region.available() else "workers"]


def _epoch(loader: Loader) -> list[int]:
    return [int(x) for _, labels in loader for x in labels]


def _batches(loader: Loader) -> list[tuple[torch.Tensor, list[int]]]:
    return [(images, labels.tolist()) for images, labels in loader]


def _state_after(loader: Loader, epoch: int, batches: int) -> dict[str, Any]:
    """`loader`'s state after `batches` batches of `epoch` were taken."""
    loader.set_epoch(epoch)
    for i, _ in enumerate(loader):
        if i == batches - 1:
            return loader.state_dict()
    raise AssertionError(f"epoch {epoch} has fewer than {batches} batches")


def _planned(data: Path, epoch: int, batch_size: int, workers: int, **ds: Any) -> dict:
    """Batch index -> samples of `epoch`, from a plan of our own (planning sets the epoch of
    its dataset, so never the loader's)."""
    plan = BatchPlan(ShardDataset(data, **ds), batch_size, workers, drop_last=False)
    out: dict[int, list[RawSample]] = {}
    for w in range(plan.workers):
        for at, samples in plan.worker_batches(w, Position(epoch, 0)):
            if at.epoch != epoch:
                break
            out[at.batch] = samples
    return out


def _cpu_batch(samples: list[RawSample], epoch: int, j: int, dtype: torch.dtype) -> tuple:
    """What the CPU path's `build_batch` makes of batch j of `epoch` (seed 1, rank 0, AUG)."""
    gen = batch_generator(1, epoch, 0, j)
    return build_batch(samples, AUG, gen, dtype=dtype, channels_last=False, strict=True)


def _bad_batch(corrupt_shards: Path, num_workers: int) -> int:
    """Index of the batch (of 4) that holds the corrupt sample (label 1) in epoch 0."""
    planned = _planned(corrupt_shards, 0, 4, num_workers)
    return next(j for j, b in planned.items() if any(s.label == 1 for s in b))
