"""CPU output batches are reused once nothing holds them, and never while anything does."""

from __future__ import annotations

import torch

from gpufeed.data.outputs import OutputPool

SHAPE = (4, 3, 8, 8)


def _take(pool: OutputPool, shape: tuple[int, ...] = SHAPE) -> torch.Tensor:
    return pool.take(shape, torch.float32, torch.contiguous_format)


def test_a_batch_let_go_of_is_taken_again():
    pool = OutputPool(keep=2)
    first = _take(pool)
    ptr = first.data_ptr()
    del first
    assert _take(pool).data_ptr() == ptr and pool.reused == 1


def test_a_batch_or_any_view_of_it_still_held_is_never_taken():
    pool = OutputPool(keep=4)
    held = _take(pool)
    row = _take(pool)[1]  # only a view of the second batch is kept
    as_numpy = _take(pool).numpy()  # and only a numpy array of the third
    taken = {_take(pool).data_ptr() for _ in range(3)}
    assert held.data_ptr() not in taken
    assert not any(p <= row.data_ptr() < p + 4 * 3 * 64 * 4 for p in taken)
    assert as_numpy.ctypes.data not in taken
    assert pool.reused == 2  # the fourth buffer, twice; the three held ones never


def test_a_last_partial_batch_is_a_view_of_a_full_buffer_and_formats_are_kept_apart():
    pool = OutputPool(keep=2)
    ptr = _take(pool).data_ptr()
    small = _take(pool, (2, 3, 8, 8))
    assert small.shape == (2, 3, 8, 8) and small.data_ptr() == ptr
    del small
    nhwc = pool.take(SHAPE, torch.float32, torch.channels_last)
    assert nhwc.is_contiguous(memory_format=torch.channels_last) and nhwc.data_ptr() != ptr


def test_at_most_keep_buffers_are_kept():
    pool = OutputPool(keep=2)
    held = [_take(pool) for _ in range(5)]  # the loop keeps them all: each one is new
    assert len({h.data_ptr() for h in held}) == 5 and pool.reused == 0
    del held  # the pool kept the last two: they come back, then a new one is made
    again = [_take(pool) for _ in range(3)]
    assert pool.reused == 2 and len({a.data_ptr() for a in again}) == 3
