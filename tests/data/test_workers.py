"""Loader workers: real processes that make the plan's batches into shared-memory slots.

They make their batches in plan order and run on into the next epoch; a new start drops what was
made for the old one; a worker's error reaches the caller at its batch; a dead worker is named,
never waited on forever; workers stop when told to, and when the training process is gone.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from processes import Haunted, gone, wait_until

from gpufeed.data.augment import Augment
from gpufeed.data.batch import CorruptSampleError
from gpufeed.data.dataset import ShardDataset
from gpufeed.data.placement import Placement
from gpufeed.data.plan import BatchPlan, Position
from gpufeed.data.slots import Slots
from gpufeed.data.spec import BatchSpec
from gpufeed.data.workers import InlinePool, LoaderWorkerError, Stopped, WorkerPool

SMALL = Augment(size=(16, 16))
NEVER = threading.Event()  # a stop event nobody sets


def _parts(
    data: Path,
    batch_size: int,
    workers: int,
    per_worker: int = 2,
    strict: bool = False,
    augment: Augment = SMALL,
) -> tuple[BatchPlan, Slots]:
    ds = ShardDataset(data, seed=1, shuffle_buffer=8)
    plan = BatchPlan(ds, batch_size, workers, drop_last=False)
    spec = BatchSpec(
        batch_size=batch_size,
        augment=augment,
        placement=Placement.of("decoded"),
        dtype=torch.float32,
        channels_last=False,
        strict=strict,
        max_sample_bytes=ds.max_sample_bytes(),
    )
    return plan, Slots(spec, workers, per_worker)


@pytest.fixture
def make_pool() -> Iterator[Callable[..., tuple[BatchPlan, Slots, WorkerPool]]]:
    pools: list[WorkerPool] = []

    def make(data: Path, batch_size: int = 4, workers: int = 2, **kw: object):
        plan, slots = _parts(data, batch_size, workers, **kw)  # type: ignore[arg-type]
        pool = WorkerPool(plan, slots)
        pools.append(pool)
        return plan, slots, pool

    yield make
    for pool in pools:
        pool.close()


def _expected_labels(data: Path, batch_size: int, workers: int, start: Position, count: int):
    """Labels of `count` batches of the endless stream from `start`, from a plan of our own."""
    plan, _ = _parts(data, batch_size, workers)
    streams = [plan.worker_batches(w, start) for w in range(workers)]
    made: dict[Position, list[int]] = {}
    at, out = start, []
    for _ in range(count):
        while at not in made:
            for s in streams:
                got, samples = next(s)
                made[got] = [x.label for x in samples]
        out.append(made[at])
        at = plan.next_position(at)
    return out


def _take(pool: WorkerPool, slots: Slots, at: Position) -> tuple[list[int], int]:
    """Labels of batch `at` and the slot it came in; the slot is given back."""
    w, k, meta = pool.get(at, NEVER)
    labels = slots.labels[slots.index(w, k), : meta.n].tolist()
    pool.free(w, k)
    return labels, slots.index(w, k)


def test_workers_make_the_plan_in_order_and_run_on_into_the_next_epoch(shards: Path, make_pool):
    plan, slots, pool = make_pool(shards, batch_size=5, workers=3, per_worker=2)
    images_at = slots.images.data_ptr()
    pool.start(Position(0, 0))
    at, got, used = Position(0, 0), [], set()
    for _ in range(2 * plan.batches + 3):  # two epochs and into the third, from one start
        labels, index = _take(pool, slots, at)
        got.append(labels)
        used.add(index)
        at = plan.next_position(at)
    assert got == _expected_labels(shards, 5, 3, Position(0, 0), len(got))
    assert sorted(x for b in got[:10] for x in b) == list(range(48))  # epoch 0: each sample once
    # the same 3 × 2 shared slots went round: nothing was allocated per batch
    assert used <= set(range(6)) and slots.images.data_ptr() == images_at
    assert slots.images.is_shared()


def test_a_new_start_drops_what_was_made_for_the_old_one(shards: Path, make_pool):
    _, slots, pool = make_pool(shards, batch_size=4, workers=2)
    pool.start(Position(0, 0))
    _take(pool, slots, Position(0, 0))
    # the workers have filled their other slots meanwhile; start elsewhere: those are dropped
    pool.start(Position(3, 5))
    got = [_take(pool, slots, Position(3, j))[0] for j in range(5, 12)]
    assert got == _expected_labels(shards, 4, 2, Position(3, 5), 7)


def test_a_worker_error_reaches_the_caller_at_its_batch(corrupt_shards: Path, make_pool):
    """strict=True: the corrupt sample is the last in pack order; its batch raises, the batches
    before it arrive, and a new start makes batches again."""
    _, slots, pool = make_pool(corrupt_shards, batch_size=1, workers=2, strict=True)
    bad = next(
        j
        for j, labels in enumerate(_expected_labels(corrupt_shards, 1, 2, Position(0, 0), 11))
        if labels == [1]
    )
    pool.start(Position(0, 0))
    for j in range(bad):
        assert _take(pool, slots, Position(0, j))[0] == [0]
    with pytest.raises(CorruptSampleError, match=r"shard .*shard-00000\.tar, key .*_bad"):
        pool.get(Position(0, bad), NEVER)
    pool.start(Position(1, 0))
    assert len(_take(pool, slots, Position(1, 0))[0]) == 1


def test_waiting_stops_when_asked(shards: Path, make_pool):
    _, _, pool = make_pool(shards)  # never started: nothing will come
    stop = threading.Event()
    stop.set()
    with pytest.raises(Stopped):
        pool.get(Position(0, 0), stop)


def _kill(worker: Any) -> Any:
    """SIGKILLs a pool's worker process and waits until it is gone; returns it."""
    os.kill(worker.pid, signal.SIGKILL)
    worker.join(timeout=30)
    return worker


@pytest.mark.timeout(60)
def test_a_dead_worker_is_named_with_its_pid_and_signal(shards: Path, make_pool):
    _, _, pool = make_pool(shards, workers=2)
    victim = _kill(pool.processes[1])
    with pytest.raises(
        LoaderWorkerError, match=rf"loader worker 1 \(pid {victim.pid}\) was killed by signal 9"
    ):
        pool.get(Position(0, 1), NEVER)  # batch 1 is worker 1's


@pytest.mark.timeout(60)
def test_starting_a_pool_with_a_dead_worker_names_it(shards: Path, make_pool):
    _, _, pool = make_pool(shards, workers=2)
    victim = _kill(pool.processes[1])
    with pytest.raises(LoaderWorkerError, match=rf"loader worker 1 \(pid {victim.pid}\)"):
        pool.start(Position(0, 0))
        pool.get(Position(0, 1), NEVER)


def _collect(batch: torch.Tensor) -> torch.Tensor:
    gc.collect()  # a full collection in the worker, on every batch
    return batch


def test_workers_never_finalize_objects_inherited_from_the_training_process(
    shards: Path, tmp_path: Path
):
    diary = tmp_path / "finalized"
    plan, slots = _parts(shards, 4, 1, augment=Augment(size=(16, 16), transform=_collect))
    gc.disable()  # keep the cycle alive until the worker is forked
    try:
        Haunted(diary)
        pool = WorkerPool(plan, slots)
    finally:
        gc.enable()
    try:
        pool.start(Position(0, 0))
        for b in range(3):
            _take(pool, slots, Position(0, b))
    finally:
        pool.close()
    gc.collect()
    assert diary.read_text().split() == [str(os.getpid())]  # finalized here, and only here


def test_workers_run_at_a_lower_priority_than_the_training_process(shards: Path, make_pool):
    _, slots, pool = make_pool(shards, workers=2)
    pool.start(Position(0, 0))
    _take(pool, slots, Position(0, 0))  # both workers are at work
    _take(pool, slots, Position(0, 1))
    mine = psutil.Process().nice()
    assert [psutil.Process(pid).nice() for pid in pool.pids] == [min(19, mine + 5)] * 2


def test_close_stops_the_worker_processes(shards: Path):
    plan, slots = _parts(shards, 4, 2)
    pool = WorkerPool(plan, slots)
    pool.start(Position(0, 0))
    _take(pool, slots, Position(0, 0))
    pids = pool.pids
    pool.close()
    assert wait_until(lambda: all(gone(pid) for pid in pids))
    children = {p.pid for p in psutil.Process().children()}
    assert not children & set(pids)


@pytest.mark.timeout(120)
def test_workers_exit_when_the_training_process_dies(shards: Path, tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(f"""
        import os
        from gpufeed.data.augment import Augment
        from gpufeed.data.loader import Loader
        loader = Loader({str(shards)!r}, 2, num_workers=2, augment=Augment(size=(8, 8)))
        next(iter(loader))
        print(*loader._pool.pids, flush=True)
        os._exit(0)  # no cleanup: as if killed
        """)
    )
    cp = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=90)
    assert cp.returncode == 0, cp.stderr[-3000:]
    pids = [int(x) for x in cp.stdout.split()]
    assert len(pids) == 2
    assert wait_until(lambda: all(gone(pid) for pid in pids), timeout=30)


def test_inline_pool_makes_the_same_batches_as_one_worker(shards: Path):
    plan, slots = _parts(shards, 5, 1)
    epoch_before = plan.dataset.epoch
    pool = InlinePool(plan, slots)
    pool.start(Position(2, 3))
    at, got = Position(2, 3), []
    for _ in range(10):
        w, k, meta = pool.get(at, NEVER)
        got.append(slots.labels[slots.index(w, k), : meta.n].tolist())
        at = plan.next_position(at)
    assert got == _expected_labels(shards, 5, 1, Position(2, 3), 10)
    assert plan.dataset.epoch == epoch_before  # it plans on a copy of the dataset
    assert pool.pids == []
