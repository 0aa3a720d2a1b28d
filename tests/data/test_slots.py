"""Host slots live in shared memory from the start: what a forked worker writes, the parent reads."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from gpufeed.data.augment import Augment
from gpufeed.data.placement import Placement
from gpufeed.data.slots import Slots, shared_zeros
from gpufeed.data.spec import BatchSpec


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32, torch.int64])
def test_shared_zeros_is_zero_filled_shared_memory_of_the_asked_shape(dtype):
    t = shared_zeros((3, 5, 7), dtype)
    assert t.shape == (3, 5, 7) and t.dtype == dtype and t.is_contiguous()
    assert t.is_shared() and not t.any()


def test_an_empty_shared_tensor_is_allowed():
    assert shared_zeros((4, 0), torch.int64).shape == (4, 0)


def _fill(images: torch.Tensor, labels: torch.Tensor) -> None:
    images[1].fill_(7)
    labels[1, :3] = torch.tensor([4, 5, 6])


def test_what_a_forked_process_writes_to_a_slot_the_parent_sees():
    spec = BatchSpec(
        batch_size=4,
        augment=Augment(size=(8, 8)),
        placement=Placement.of("decoded"),
        dtype=torch.float32,
        channels_last=False,
        strict=False,
        max_sample_bytes=1000,
    )
    slots = Slots(spec, workers=1, per_worker=2)
    assert slots.images.shape == (2, *spec.host_shape)
    p = mp.get_context("fork").Process(target=_fill, args=(slots.images, slots.labels))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    assert (slots.images[1] == 7).all() and not slots.images[0].any()
    assert slots.labels[1, :3].tolist() == [4, 5, 6]
