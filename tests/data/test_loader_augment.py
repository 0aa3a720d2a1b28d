"""What the training loop gets: normalized float (or uint8, channels-last) batches that are the CPU
path's batches (the same crops, flips and angles, keyed by batch index, whichever worker made them),
and the user's own batched transform, on the workers or on the device.

The other hand-offs (preprocess="gpu", decoder="workers", CUDA): test_loader_paths.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from loader_helpers import AUG, SMALL, UINT8_TOL, MakeLoader, _cpu_batch, _planned

from gpufeed.data.augment import Augment

# --- what the training loop gets ----------------------------------------------------------------


def test_yields_normalized_float_batches_ready_for_a_model(shards: Path, make: MakeLoader):
    loader = make(shards, 8, num_workers=0)
    images, labels = next(iter(loader))
    assert images.shape == (8, 3, 16, 16) and images.dtype == torch.float32
    assert labels.dtype == torch.long and labels.shape == (8,)
    assert -3 < images.mean().item() < 3 and images.std().item() > 0.1


@pytest.mark.parametrize("preprocess", ["cpu", "gpu"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_uint8_channels_last_output(
    shards: Path, make: MakeLoader, preprocess: str, num_workers: int
):
    loader = make(
        shards,
        8,
        num_workers=num_workers,
        preprocess=preprocess,
        dtype=torch.uint8,
        channels_last=True,
    )
    for images, _ in loader:
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, 16, 16)
        assert images.is_contiguous(memory_format=torch.channels_last)


# --- the hand-off: uint8 from workers, normalized by the device stage ---------------------------


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_batches_are_the_cpu_path_batches_keyed_by_batch_index(
    shards: Path, make: MakeLoader, num_workers: int, channels_last: bool
):
    """Batch j is what `build_batch` makes straight to float from batch j's planned samples with
    the generator keyed by j, whichever worker made it; up to uint8 rounding where the hand-off
    is uint8 (normalized by the device stage, see test_device)."""
    loader = make(
        shards, 8, num_workers=num_workers, augment=AUG, seed=1, channels_last=channels_last
    )
    loader.set_epoch(1)
    planned = _planned(shards, 1, 8, num_workers, seed=1)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    for j, (images, labels) in enumerate(loader):
        want, want_labels, _ = _cpu_batch(planned[j], 1, j, torch.float32)
        assert torch.equal(labels, want_labels)
        assert images.dtype == torch.float32 and images.is_contiguous(memory_format=fmt)
        assert (images - want).abs().max() <= UINT8_TOL
    assert j == len(planned) - 1 == 5


def test_uint8_output_is_exactly_the_uint8_batch_of_the_cpu_path(shards: Path, make: MakeLoader):
    loader = make(shards, 8, num_workers=2, augment=AUG, seed=1, dtype=torch.uint8)
    planned = _planned(shards, 0, 8, 2, seed=1)
    for j, (images, _) in enumerate(loader):
        want, _, _ = _cpu_batch(planned[j], 0, j, torch.uint8)
        assert torch.equal(images, want)


# --- the user's own batched transform -----------------------------------------------------------


class Invert(torch.nn.Module):
    """A batched transform as torchvision.transforms.v2 or kornia write them: uint8 in, uint8 out."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.dtype == torch.uint8 and x.dim() == 4 and x.shape[1] == 3
        return 255 - x


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_worker_transform_runs_on_the_uint8_batch_before_normalization(
    shards: Path, make: MakeLoader, num_workers: int
):
    def epoch(**kw: Any) -> list[torch.Tensor]:
        return [x for x, _ in make(shards, 8, num_workers=num_workers, shuffle=False, **kw)]

    inverted = Augment(size=(16, 16), transform=Invert())
    plain = epoch(dtype=torch.uint8)
    got = epoch(dtype=torch.uint8, augment=inverted)
    assert all(torch.equal(g, 255 - p) for g, p in zip(got, plain, strict=True))
    mean = torch.tensor(SMALL.mean).view(1, 3, 1, 1)
    std = torch.tensor(SMALL.std).view(1, 3, 1, 1)
    normalized = epoch(augment=inverted)  # float batches: normalized after the transform
    for f, p in zip(normalized, plain, strict=True):
        assert torch.allclose(f, ((255 - p).float() / 255 - mean) / std, atol=1e-5)


def test_a_device_transform_runs_on_the_finished_batch_and_may_change_its_shape(
    shards: Path, make: MakeLoader
):
    def shrink(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.avg_pool2d(x, 2)

    plain = [x for x, _ in make(shards, 8, num_workers=2, shuffle=False)]
    aug = Augment(size=(16, 16), transform=shrink, transform_on="device")
    got = [x for x, _ in make(shards, 8, num_workers=2, shuffle=False, augment=aug)]
    assert [g.shape for g in got] == [(len(p), 3, 8, 8) for p in plain]
    assert all(torch.allclose(g, shrink(p)) for g, p in zip(got, plain, strict=True))


@pytest.mark.parametrize("decoder", ["auto", "workers"])
def test_a_worker_transform_with_gpu_preprocessing_is_a_clear_error(
    shards: Path, make: MakeLoader, decoder: str
):
    aug = Augment(size=(16, 16), transform=Invert())
    loader = make(shards, 8, num_workers=0, preprocess="gpu", decoder=decoder, augment=aug)
    with pytest.raises(ValueError, match=r"transform_on='worker'\) needs preprocess='cpu'"):
        next(iter(loader))
