"""The Loader's host memory: shared-memory slots lent to the loop on a CPU device and reused only once
let go of (copies when the workers have none to spare), and the cap on host memory that sizes them.

More on `max_host_bytes`: test_loader_option_errors.py.
"""

from __future__ import annotations

import gc
import re
from pathlib import Path

import pytest
import torch
from loader_helpers import MakeLoader, _epoch

from gpufeed.data.budget import default_max_host_bytes, machine_memory

# --- slots and lending --------------------------------------------------------------------------


def test_batches_the_loop_holds_are_never_overwritten_by_slot_reuse(shards: Path, make: MakeLoader):
    loader = make(shards, 2, num_workers=2, prefetch=1, seed=5, dtype=torch.uint8)
    held, copies = [], []
    for images, _ in loader:  # 24 batches through 2 × 2 slots
        held.append(images[1:])  # a view, the way a user might keep one
        copies.append(images[1:].clone())
    for _ in range(2):  # the slots go round again
        _epoch(loader)
    assert all(torch.equal(h, c) for h, c in zip(held, copies, strict=True))


def test_cpu_batches_are_the_workers_slots_lent_and_reused_once_let_go_of(
    shards: Path, make: MakeLoader
):
    loader = make(shards, 2, num_workers=2, seed=5)
    buffers = {images.data_ptr() for images, _ in loader}  # each batch dropped at the next
    # every batch of the epoch was its slot, not one copied out of it (the feeder may already
    # have lent the next epoch's first batches, which count too)
    assert loader.stats()["lent_batches"] >= 24 and loader._lender.copied == 0
    assert len(buffers) <= 10  # 2 workers × (prefetch 2 + 1 + 2 for lent batches) slots


def test_a_loop_that_keeps_every_batch_gets_copies_once_the_workers_have_no_slot_to_spare(
    shards: Path, make: MakeLoader
):
    loader = make(shards, 2, num_workers=2, prefetch=1, seed=5)
    held, copies = [], []
    for images, _ in loader:
        held.append(images)
        copies.append(images.clone())
    lent = loader.stats()["lent_batches"]
    assert 0 < lent < 24  # each worker lends all of its slots but one, then copies
    for _ in range(2):  # the slots go round again
        _epoch(loader)
    assert all(torch.equal(h, c) for h, c in zip(held, copies, strict=True))


def test_a_lent_batch_outlives_its_loader(shards: Path, make: MakeLoader):
    loader = make(shards, 2, num_workers=2, seed=5)
    images, _ = next(iter(loader))
    want = images.clone()
    assert loader.stats()["lent_batches"] >= 1
    loader.close()
    del loader
    gc.collect()
    assert torch.equal(images, want)  # its shared memory stays mapped while the batch lives


# --- host memory --------------------------------------------------------------------------------


def test_host_memory_cap_defaults_to_a_quarter_of_the_machine(shards: Path, make: MakeLoader):
    loader = make(shards, 8, num_workers=2)
    assert loader.max_host_bytes == default_max_host_bytes() == machine_memory() // 4
    st = loader.stats()
    assert st["max_host_bytes"] == machine_memory() // 4
    assert 0 < st["host_bytes_bound"] <= st["max_host_bytes"]


def test_a_cap_too_small_is_refused_saying_what_would_do(shards: Path, make: MakeLoader):
    with pytest.raises(ValueError, match=r"max_host_bytes=1,000 is too small") as raised:
        make(shards, 8, num_workers=2, max_host_bytes=1000)
    need = int(re.search(r"pass max_host_bytes=(\d+)", str(raised.value)).group(1))  # type: ignore[union-attr]
    enough = make(shards, 8, num_workers=2, max_host_bytes=need)
    assert enough.prefetch == 1
    assert sorted(_epoch(enough)) == list(range(48))


def test_prefetch_is_lowered_to_fit_the_cap(shards: Path, make: MakeLoader):
    probe = make(shards, 8, num_workers=2, prefetch=4)
    assert probe.prefetch == 4
    cap = probe.host_bytes_bound(1)  # room for prefetch 1 only
    capped = make(shards, 8, num_workers=2, prefetch=4, max_host_bytes=cap)
    assert capped.prefetch == 1 and capped.stats()["host_bytes_bound"] <= cap
    assert sorted(_epoch(capped)) == list(range(48))
