"""The Loader's worker processes: a corrupt sample left out of its batch and reported (or raised
with strict=True), a killed worker named, not a hang; workers and the feeder stopped by close(), by
dropping the loader, at interpreter exit and in a forked child; one iteration at a time.

More on worker errors: test_worker_errors.py, test_stuck_workers.py.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from loader_helpers import SMALL, MakeLoader, _bad_batch, _epoch, _planned
from processes import gone, wait_until

from gpufeed.data.augment import Augment
from gpufeed.data.batch import CorruptSampleError
from gpufeed.data.loader import Loader
from gpufeed.data.workers import LoaderWorkerError


# Here, not imported from loader_helpers: the corrupt-sample warning points at the first frame
# outside gpufeed that took the batch, and a test below checks that it is this file.
def _batches(loader: Loader) -> list[tuple[torch.Tensor, list[int]]]:
    return [(images, labels.tolist()) for images, labels in loader]


# --- corrupt samples ----------------------------------------------------------------------------


@pytest.mark.parametrize("preprocess", ["cpu", "gpu"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_corrupt_image_is_left_out_of_its_batch_and_reported_with_shard_and_key(
    corrupt_shards: Path, make: MakeLoader, preprocess: str, num_workers: int
):
    loader = make(corrupt_shards, 4, num_workers=num_workers, preprocess=preprocess)
    said = r"left a corrupt sample out of its batch \(shard \S*shard-00000\.tar, key \S*_bad: "
    with pytest.warns(RuntimeWarning, match=said) as caught:
        got = [labels for _, labels in _batches(loader)]
    (warned,) = [w for w in caught if "corrupt" in str(w.message)]  # once, not per sample
    assert warned.filename == __file__  # it points at the loop that took the batch
    bad = _bad_batch(corrupt_shards, num_workers)
    planned = _planned(corrupt_shards, 0, 4, num_workers)
    assert [len(b) for b in got] == [len(planned[j]) - (j == bad) for j in range(len(planned))]
    assert [x for b in got for x in b] == [0] * 10
    st = loader.stats()
    assert st["corrupt"] == 1
    (report,) = st["corrupt_samples"]
    assert report["shard"].endswith("shard-00000.tar") and report["key"].endswith("_bad")
    assert "decode" in report["reason"]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_batch_left_with_no_samples_is_delivered_empty_with_a_warning_naming_it(
    corrupt_shards: Path, make: MakeLoader, num_workers: int
):
    loader = make(corrupt_shards, 1, num_workers=num_workers)  # the corrupt sample is a batch
    planned = _planned(corrupt_shards, 0, 1, num_workers)
    bad = next(j for j, b in planned.items() if b[0].label == 1)
    with pytest.warns(
        RuntimeWarning, match=rf"batch {bad} of epoch 0 is empty: its 1 sample is corrupt"
    ):
        got = _batches(loader)
    assert [len(labels) for _, labels in got] == [int(j != bad) for j in range(len(planned))]
    assert got[bad][0].shape[0] == 0 and loader.stats()["corrupt"] == 1


@pytest.mark.parametrize("preprocess", ["cpu", "gpu"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_strict_raises_at_the_corrupt_batch_naming_shard_and_key(
    corrupt_shards: Path, make: MakeLoader, preprocess: str, num_workers: int
):
    loader = make(corrupt_shards, 4, num_workers=num_workers, preprocess=preprocess, strict=True)
    delivered = 0
    with pytest.raises(CorruptSampleError, match=r"shard .*shard-00000\.tar, key \S*_bad"):
        for _ in loader:
            delivered += 1
    assert delivered == _bad_batch(corrupt_shards, num_workers)
    assert loader.state_dict()["batch"] == delivered


# --- worker processes ---------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_a_killed_worker_raises_loader_worker_error_not_a_hang(shards: Path, make: MakeLoader):
    loader = make(shards, 2, num_workers=2)
    it = iter(loader)
    next(it)
    victim = loader._pool.pids[1]
    os.kill(victim, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(LoaderWorkerError, match=r"loader worker 1\b"):
        for _ in it:
            pass
    assert time.monotonic() - t0 < 60


@pytest.mark.timeout(240)
def test_a_killed_worker_is_always_named_with_its_pid(shards: Path):
    for _ in range(120):  # stops at the first message without the pid
        with Loader(shards, 2, num_workers=2, augment=SMALL, device="cpu") as loader:
            it = iter(loader)
            next(it)
            victim = loader._pool.pids[1]
            os.kill(victim, signal.SIGKILL)
            with pytest.raises(LoaderWorkerError) as raised:
                for _ in it:
                    pass
            assert f"pid {victim}" in str(raised.value), str(raised.value)
        # the error's traceback holds the loop's frames, and so the loader's shared-memory
        # slots, in a cycle: collect it, or 120 loaders hold a thousand file descriptors at once
        del raised, it
        gc.collect()


@pytest.mark.timeout(120)
def test_a_worker_killed_between_epochs_raises_loader_worker_error(shards: Path, make: MakeLoader):
    loader = make(shards, 4, num_workers=2)
    _epoch(loader)
    victim = loader._pool.processes[1]
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(timeout=30)
    loader.set_epoch(5)  # another epoch than the workers ran on into: they are restarted
    with pytest.raises(LoaderWorkerError, match=r"loader worker 1\b"):
        _epoch(loader)


def test_close_stops_the_worker_processes(shards: Path):
    loader = Loader(shards, 4, num_workers=2, augment=SMALL, device="cpu")
    next(iter(loader))
    pids = list(loader._pool.pids)
    assert len(pids) == 2 and not any(gone(pid) for pid in pids)
    loader.close()
    assert wait_until(lambda: all(gone(pid) for pid in pids))
    assert not {p.pid for p in psutil.Process().children()} & set(pids)


def test_a_loader_dropped_without_close_stops_its_workers_at_once(shards: Path):
    gc.disable()  # freed by reference counting, not whenever the cycle collector runs
    try:
        loader = Loader(shards, 4, num_workers=2, augment=SMALL, device="cpu")
        for i, _ in enumerate(loader):
            if i == 1:
                break
        pids = list(loader._pool.pids)
        del loader
        assert wait_until(lambda: all(gone(pid) for pid in pids))
    finally:
        gc.enable()


def test_an_iteration_refused_after_the_workers_started_leaves_no_workers(shards: Path):
    before = {p.pid for p in psutil.Process().children()}
    on_worker = Augment(size=(16, 16), transform=lambda x: x, transform_on="worker")
    loader = Loader(shards, 4, num_workers=2, augment=on_worker, preprocess="gpu", device="cpu")
    for _ in range(2):  # each try is refused the same way, and starts no workers of its own
        with pytest.raises(ValueError, match="transform_on"):
            iter(loader)
    loader.close()
    assert wait_until(lambda: not {p.pid for p in psutil.Process().children()} - before)


def test_a_forked_child_lets_go_of_the_parents_workers(shards: Path, make: MakeLoader):
    # the child's iteration moved the parent's workers on (the parent then waited forever), and
    # the child's garbage collection stopped them
    loader = make(shards, 4, num_workers=2, seed=3)
    expected = _epoch(make(shards, 4, num_workers=2, seed=3))
    it = iter(loader)
    first = [int(x) for x in next(it)[1]]
    pid = os.fork()
    if pid == 0:  # the child: iterating is refused; dropping the copy touches nothing
        code = 3
        try:
            iter(loader)
        except RuntimeError as e:
            code = 0 if "belong to the process it was forked from" in str(e) else 4
        finally:  # whatever happens, the child never goes on running the tests
            with contextlib.suppress(BaseException):
                del it
                loader.close()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert first + [int(x) for _, labels in it for x in labels] == expected


# --- the feeder thread at close and exit --------------------------------------------------------


def test_a_loop_that_ends_without_close_has_its_loader_closed_at_exit(shards: Path, tmp_path: Path):
    # The usual training script: iterate, break (or finish), exit. The feeder thread still runs
    # on into the next batches; left to interpreter finalization inside torch code it aborted the
    # process ("terminate called without an active exception", exit code 134, ~1 run in 10).
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(f"""
        import atexit, threading
        from gpufeed.data.augment import Augment
        from gpufeed.data.loader import Loader
        loader = Loader({str(shards)!r}, 4, num_workers=1, augment=Augment(size=(8, 8)),
                        device="cpu")
        for i, _ in enumerate(loader):
            if i == 2:
                break
        alive = lambda: sorted(t.name for t in threading.enumerate() if t.name.startswith("gpufeed"))
        print("before exit:", alive())
        atexit._run_exitfuncs()  # what the interpreter runs first when the script ends
        print("after exit hooks:", alive(), flush=True)
        """)
    )
    cp = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr[-3000:]
    before, after = cp.stdout.splitlines()[-2:]
    assert "gpufeed-feeder" in before  # the loop left it running
    assert after == "after exit hooks: []"


def _first_read_waits(loader: Loader, wait: Callable[[], object]) -> threading.Event:
    """Make the loader's first shard read call `wait()` before it reads; the event returned is set
    once that read has begun."""
    source = loader.dataset.source
    real_open = source.open
    reading = threading.Event()

    def open_(*args: Any, **kw: Any) -> Any:
        if not reading.is_set():
            reading.set()
            wait()
        return real_open(*args, **kw)

    source.open = open_
    return reading


@pytest.mark.timeout(120)
def test_a_loader_freed_mid_read_has_its_feeder_waited_for_at_exit(shards: Path):
    # A Loader made and dropped in a function is freed at once (never waiting: it may be freed on
    # any thread); its feeder, still inside a read, must not be left to interpreter finalization.
    from gpufeed.data.loader import _close_open_loaders

    def feeders() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name == "gpufeed-feeder"}

    earlier = feeders()  # an earlier test's loader closed mid-read may still be stopping
    loader = Loader(shards, 4, num_workers=0, augment=SMALL, device="cpu")
    reading = _first_read_waits(loader, lambda: time.sleep(1.0))  # a slow connection
    iter(loader)
    assert reading.wait(30)
    gc.disable()
    try:
        del loader  # freed here, by reference counting
        assert feeders() - earlier  # still reading
        _close_open_loaders()  # what the interpreter runs when the script ends
        assert not feeders() - earlier
    finally:
        gc.enable()


def test_close_returns_promptly_while_a_read_hangs(shards: Path, make: MakeLoader):
    loader = make(shards, 4, num_workers=0)  # the feeder thread reads the shards itself
    release = threading.Event()
    reading = _first_read_waits(loader, lambda: release.wait(6))  # a stalled connection
    iter(loader)
    assert reading.wait(30)
    t0 = time.monotonic()
    try:
        loader.close()
    finally:
        release.set()
    assert time.monotonic() - t0 < 3


# --- the iterator -------------------------------------------------------------------------------


def test_the_iterator_is_a_dataloader_iterator_for_profilers(shards: Path, make: MakeLoader):
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    loader = make(shards, 4, num_workers=2)
    it = iter(loader)
    assert isinstance(it, _BaseDataLoaderIter)
    assert len(it) == len(loader) == 12
    next(it)
    assert sorted(p.pid for p in it._workers) == sorted(loader._pool.pids)
    assert all(isinstance(p.pid, int) for p in it._workers) and len(it._workers) == 2
    assert iter(make(shards, 4, num_workers=0))._workers == []


def test_one_iteration_at_a_time(shards: Path, make: MakeLoader):
    loader = make(shards, 4, num_workers=2)
    old = iter(loader)
    next(old)
    new = iter(loader)
    next(new)
    with pytest.raises(RuntimeError, match="another iteration over this Loader has started"):
        next(old)
