"""BatchPlan: a rank's epoch is cut into whole batches before it is dealt to workers.

Batch j of an epoch is made by worker j % W; every batch is full except at most the last of the
epoch, which drop_last drops; the plan is a pure function of (seed, epoch, rank, W), so a worker
can start anywhere (resume) and run on into the next epoch.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from itertools import islice
from pathlib import Path

import pytest

from gpufeed.data.dataset import RawSample, ShardDataset
from gpufeed.data.plan import BatchPlan, Position


def _plan(
    shards: Path, batch_size: int, workers: int, drop_last: bool = False, **ds: object
) -> BatchPlan:
    dataset = ShardDataset(shards, shuffle_buffer=8, drop_last=drop_last, **ds)  # type: ignore[arg-type]
    return BatchPlan(dataset, batch_size, workers, drop_last)


def _epoch_batches(plan: BatchPlan, epoch: int) -> dict[int, list[RawSample]]:
    """Batch index -> samples, for every batch of `epoch`, collected worker by worker."""
    return {j: samples for j, (_, samples) in _made_by(plan, epoch).items()}


def _made_by(plan: BatchPlan, epoch: int) -> dict[int, tuple[int, list[RawSample]]]:
    """Batch index -> (the worker whose stream made it, its samples), for every batch of `epoch`."""
    out: dict[int, tuple[int, list[RawSample]]] = {}
    for w in range(plan.workers):
        for at, samples in plan.worker_batches(w, Position(epoch, 0)):
            if at.epoch != epoch:
                break
            assert at.batch not in out, f"batch {at.batch} made twice"
            out[at.batch] = (w, samples)
    return out


def _labels_of_ids(ds: ShardDataset, ids: Iterator[int]) -> list[int]:
    by_id = [label for entry in ds.index.shards for label in entry.labels]
    return [by_id[int(i)] for i in ids]


@pytest.mark.parametrize(
    ("batch_size", "drop_last", "sizes"),
    [
        (5, False, [5] * 9 + [3]),
        (5, True, [5] * 9),
        (8, False, [8] * 6),
        (8, True, [8] * 6),
        (48, False, [48]),
        (50, False, [48]),
    ],
)
@pytest.mark.parametrize("workers", [1, 2, 3, 4])
def test_only_the_last_batch_may_be_partial_and_drop_last_drops_it(
    shards: Path, batch_size: int, drop_last: bool, sizes: list[int], workers: int
):
    plan = _plan(shards, batch_size, workers, drop_last)
    assert plan.batches == len(sizes)
    assert [plan.batch_len(j) for j in range(plan.batches)] == sizes
    got = _epoch_batches(plan, epoch=1)
    assert sorted(got) == list(range(len(sizes)))
    assert [len(got[j]) for j in range(len(sizes))] == sizes


@pytest.mark.parametrize("workers", [1, 2, 3, 4])
def test_batches_are_dealt_round_robin_continuing_across_epochs(shards: Path, workers: int):
    """Batch j of epoch e is made by worker (e·B + j) mod W: the loop takes batches from the
    workers in turn, also across the epoch boundary (B = 10 batches per epoch here)."""
    plan = _plan(shards, 5, workers)
    made_by = {}
    for w in range(workers):
        for at, _ in plan.worker_batches(w, Position(0, 0)):
            if at.epoch == 3:
                break
            made_by[at] = w
            assert plan.worker_of(at) == w
    stream = [Position(e, j) for e in range(3) for j in range(10)]
    assert sorted(made_by, key=lambda at: (at.epoch, at.batch)) == stream
    assert [made_by[at] for at in stream] == [g % workers for g in range(30)]


@pytest.mark.timeout(60)
def test_more_workers_than_batches_each_get_batches_in_later_epochs(shards: Path):
    plan = _plan(shards, 16, 7)  # 3 batches per epoch, 7 workers
    firsts = [next(plan.worker_batches(w, Position(0, 0)))[0] for w in range(7)]
    assert firsts == [
        Position(0, 0),
        Position(0, 1),
        Position(0, 2),
        Position(1, 0),
        Position(1, 1),
        Position(1, 2),
        Position(2, 0),
    ]


@pytest.mark.parametrize("workers", [1, 2, 3, 4])
@pytest.mark.parametrize("world", [1, 2, 5])
def test_every_sample_of_the_rank_is_in_exactly_one_batch(shards: Path, workers: int, world: int):
    for rank in range(world):
        plan = _plan(shards, 4, workers, rank=rank, world_size=world, seed=2)
        ds = copy.copy(plan.dataset)
        ds.set_epoch(3)
        expected = _labels_of_ids(ds, ds.rank_sequence())
        got = [s.label for j, b in sorted(_epoch_batches(plan, 3).items()) for s in b]
        assert sorted(got) == sorted(expected)


def test_each_worker_reads_one_contiguous_region_of_the_read_order(shards: Path):
    """Streaming-friendly: worker w's samples of an epoch are one run of the rank's read order."""
    plan = _plan(shards, 5, 3, seed=4)
    ds = copy.copy(plan.dataset)
    ds.set_epoch(2)
    read_order = _labels_of_ids(ds, ds.rank_sequence())
    made = _made_by(plan, 2)
    start = 0
    for w in range(3):
        mine = [s.label for j in sorted(made) if made[j][0] == w for s in made[j][1]]
        assert sorted(mine) == sorted(read_order[start : start + len(mine)])
        start += len(mine)
    assert start == 48


@pytest.mark.parametrize("workers", [1, 2, 3, 5])
@pytest.mark.parametrize("world", [1, 2])
def test_unshuffled_batch_j_is_the_read_orders_samples_j_times_b_on_whatever_the_workers(
    shards: Path, workers: int, world: int
):
    for rank in range(world):
        plan = _plan(shards, 5, workers, shuffle=False, rank=rank, world_size=world)
        ds = copy.copy(plan.dataset)
        packed = _labels_of_ids(ds, ds.rank_sequence())
        batches = _epoch_batches(plan, 1)
        assert [len(b) for _, b in sorted(batches.items())] == [
            plan.batch_len(j) for j in range(plan.batches)
        ]
        assert [s.label for _, b in sorted(batches.items()) for s in b] == packed


def test_batch_count_and_sizes_do_not_depend_on_the_number_of_workers(shards: Path):
    shapes = set()
    for workers in (1, 2, 3, 5, 7):
        plan = _plan(shards, 7, workers)
        shapes.add(tuple(len(b) for _, b in sorted(_epoch_batches(plan, 0).items())))
    assert shapes == {(7, 7, 7, 7, 7, 7, 6)}


def test_starting_mid_epoch_gives_exactly_the_rest_of_the_stream(shards: Path):
    plan = _plan(shards, 4, 2, seed=1)
    for w in range(2):
        whole = list(islice(plan.worker_batches(w, Position(5, 0)), 10))
        for first in (1, 2, 5, 7, 11, 12):
            tail = [(at, b) for at, b in whole if at.epoch > 5 or at.batch >= first]
            resumed = list(islice(plan.worker_batches(w, Position(5, first)), len(tail)))
            assert [at for at, _ in resumed] == [at for at, _ in tail]
            assert [[s.key for s in b] for _, b in resumed] == [[s.key for s in b] for _, b in tail]


def test_a_worker_runs_on_into_the_next_epoch(shards: Path):
    plan = _plan(shards, 5, 3, seed=6)  # 10 batches per epoch: worker 1 makes 1, 4, 7, 10, 13, ...
    ran_on = list(islice(plan.worker_batches(1, Position(0, 0)), 5))
    assert [at for at, _ in ran_on] == [
        Position(0, 1),
        Position(0, 4),
        Position(0, 7),
        Position(1, 0),
        Position(1, 3),
    ]
    # what it made for epoch 1 is what it makes when told to start at epoch 1
    fresh = list(islice(_plan(shards, 5, 3, seed=6).worker_batches(1, Position(1, 0)), 2))
    assert [at for at, _ in fresh] == [at for at, _ in ran_on[3:]]
    assert [[s.key for s in b] for _, b in fresh] == [[s.key for s in b] for _, b in ran_on[3:]]


def test_epochs_and_seeds_change_the_batches(shards: Path):
    def first_batch(epoch: int, seed: int) -> list[str]:
        plan = _plan(shards, 8, 2, seed=seed)
        return [s.key for s in next(plan.worker_batches(0, Position(epoch, 0)))[1]]

    assert first_batch(0, 1) == first_batch(0, 1)
    assert first_batch(0, 1) != first_batch(1, 1)
    assert first_batch(0, 1) != first_batch(0, 2)


def test_next_position_walks_the_batches_then_the_next_epoch(shards: Path):
    plan = _plan(shards, 16, 2)  # 3 batches
    at, walked = Position(4, 0), []
    for _ in range(5):
        walked.append(at)
        at = plan.next_position(at)
    assert walked == [
        Position(4, 0),
        Position(4, 1),
        Position(4, 2),
        Position(5, 0),
        Position(5, 1),
    ]


def test_drop_last_with_too_few_samples_for_one_batch_is_refused(shards: Path):
    with pytest.raises(ValueError, match=r"batch_size=64 with drop_last=True leaves no batch"):
        _plan(shards, 64, 2, drop_last=True)


def test_uneven_rank_split_drop_last_drops_the_remainder_and_the_partial_batch(shards: Path):
    # 48 samples over 5 ranks: 9 each with drop_last (3 left out), cut into batches of 4: 2 batches
    plans = [_plan(shards, 4, 2, drop_last=True, rank=r, world_size=5) for r in range(5)]
    assert {p.batches for p in plans} == {2}
    labels = [s.label for p in plans for b in _epoch_batches(p, 0).values() for s in b]
    assert len(labels) == len(set(labels)) == 40
