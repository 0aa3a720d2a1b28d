"""A lent slot is the batch itself, goes back to its worker once nothing holds it (or any view
of it), and a worker always keeps a slot of its own."""

from __future__ import annotations

import pytest
import torch

from gpufeed.data.augment import Augment
from gpufeed.data.lending import Lender
from gpufeed.data.placement import Placement
from gpufeed.data.slots import Slots
from gpufeed.data.spec import BatchSpec


def _slots(dtype: torch.dtype = torch.float32, per_worker: int = 3) -> Slots:
    spec = BatchSpec(
        batch_size=4,
        augment=Augment(size=(8, 8)),
        placement=Placement.of("decoded", host_final=True),
        dtype=dtype,
        channels_last=False,
        strict=False,
        max_sample_bytes=1000,
    )
    return Slots(spec, workers=2, per_worker=per_worker)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.uint8])
def test_a_lent_batch_is_the_slot_itself(dtype: torch.dtype):
    slots = _slots(dtype)
    lent = Lender(slots).lend(1, 2)
    assert lent is not None and lent.dtype == dtype and lent.shape == slots.images[5].shape
    slots.images[5].fill_(3)  # what the worker writes, the loop sees: no copy between
    assert bool((lent == 3).all())


def test_a_slot_goes_back_only_once_the_batch_and_every_view_of_it_are_dropped():
    lender = Lender(_slots())
    batch = lender.lend(0, 1)
    assert batch is not None
    row, array = batch[2], batch[1:].numpy()
    assert lender.returned() == []
    del batch
    assert lender.returned() == []  # a view still holds it
    del row
    assert lender.returned() == []  # a numpy array of it still holds it
    del array
    assert lender.returned() == [(0, 1)] and lender.out == 0
    assert lender.returned() == []  # given back once


def test_a_worker_keeps_its_reserve_of_slots_however_many_batches_the_loop_holds():
    lender = Lender(_slots(per_worker=3), reserve=1)
    held = [lender.lend(0, s) for s in range(3)]
    assert held[0] is not None and held[1] is not None
    assert held[2] is None  # the worker's last slot: this batch is copied instead
    assert (lender.lent, lender.copied) == (2, 1)
    assert lender.lend(1, 0) is not None  # the other worker's slots are its own


def test_a_cancelled_lend_is_free_at_once():
    lender = Lender(_slots())
    batch = lender.lend(0, 0)
    lender.cancel(0, 0)
    assert lender.out == 0 and lender.lent == 0
    del batch
    assert lender.returned() == []  # not given back twice
