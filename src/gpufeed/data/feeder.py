"""The feeder thread: takes batches from the workers in plan order, puts them through the device
stage and keeps `depth` of them ready for the training loop, running on across epochs.

The training thread only takes ready batches (`take`): it never decodes, copies or converts.
Errors raised here (a corrupt sample in strict mode, a dead worker) reach the training thread at
the batch they belong to.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from gpufeed.data.device import DeviceBatch, DeviceStage
from gpufeed.data.lending import Lender
from gpufeed.data.plan import BatchPlan, Position
from gpufeed.data.workers import Pool, Stopped


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class Feeder:
    """The device stage's thread(s) from a start position on: `pool` → `stage.first` (→ a second
    thread running `stage.resample`, when the stage is split) → a bounded queue of ready batches."""

    def __init__(
        self,
        pool: Pool,
        stage: DeviceStage,
        plan: BatchPlan,
        depth: int,
        lender: Lender | None = None,
    ) -> None:
        self.pool, self.stage, self.plan, self.depth = pool, stage, plan, max(1, depth)
        self.lender = lender  # hands out the slots themselves (CPU batches), where given
        self.expected: Position | None = None  # the next batch `take` returns
        self._threads: list[threading.Thread] = []
        self._left: list[threading.Thread] = []  # told to stop, not yet ended when last checked
        self._stop = threading.Event()
        self._queues: list[queue.Queue[Any]] = []

    @property
    def running(self) -> bool:
        return bool(self._threads)

    @property
    def ending(self) -> bool:
        """True while threads told to stop still run (a read or a torch op to finish)."""
        return any(t.is_alive() for t in self._left)

    def start(self, at: Position) -> None:
        """(Re)start the stream at `at`: workers begin there, older batches are dropped."""
        self.stop()
        self.pool.start(at)
        self.expected = at
        stop = self._stop = threading.Event()
        out: queue.Queue[Any] = queue.Queue(self.depth)
        self._queues = [out]
        first_out = out
        if self.stage.split:
            first_out = queue.Queue(1)
            self._queues.append(first_out)
            self._threads = [self._thread(self._run_resample, first_out, out, stop, "resample")]
        else:
            self._threads = []
        self._threads.append(self._thread(self._run_from_slot, at, first_out, stop, "feeder"))
        for t in self._threads:
            t.start()

    @staticmethod
    def _thread(target: Any, *args: Any) -> threading.Thread:
        return threading.Thread(
            target=target, args=args[:-1], name=f"gpufeed-{args[-1]}", daemon=True
        )

    def _run_from_slot(self, at: Position, out: queue.Queue[Any], stop: threading.Event) -> None:
        if self.stage.one_thread:
            torch.set_num_threads(1)  # this thread's own setting (OpenMP's is per thread)
        try:
            while not stop.is_set():
                self._give_back()
                t = time.perf_counter()
                worker, slot, meta = self.pool.get(at, stop)
                self.stage.seconds["wait_workers"] += time.perf_counter() - t
                index = self.stage.slots.index(worker, slot)
                lender = self.lender
                lent = lender.lend(worker, slot) if lender is not None else None
                made = False
                try:
                    item, done = self.stage.from_slot(at, index, meta, lent)
                    if done is not None:
                        done.synchronize()  # the slot's bytes are on the device
                    made = True
                finally:
                    if lender is not None and lent is not None and not made:
                        lender.cancel(worker, slot)
                    if lent is None or not made:
                        self.pool.free(worker, slot)
                lent = None  # only the batch may hold a lent slot: it goes back once that goes
                if not _put(out, item, stop, self._give_back):
                    return
                item = None
                at = self.plan.next_position(at)
        except Stopped:
            return
        except BaseException as e:  # handed to the training thread at this batch
            _put(out, _Failure(e), stop)

    def _run_resample(
        self, src: queue.Queue[Any], out: queue.Queue[Any], stop: threading.Event
    ) -> None:
        try:
            while not stop.is_set():
                try:
                    item = src.get(timeout=0.1)
                except queue.Empty:
                    continue
                if not isinstance(item, _Failure):
                    item = self.stage.resample(item)
                if not _put(out, item, stop):
                    return
        except BaseException as e:
            _put(out, _Failure(e), stop)

    def _give_back(self) -> None:
        """Give lent slots that nothing holds any more back to their workers."""
        if self.lender is not None:
            for worker, slot in self.lender.returned():
                self.pool.free(worker, slot)

    def take(self) -> DeviceBatch:
        """The next batch, waiting for it; raises what the feeder threads raised for it."""
        out = self._queues[0]
        while True:
            try:
                item = out.get(timeout=0.5)
                break
            except queue.Empty:
                # the thread that fills `out` (the resample thread when split) passes on what
                # the other raised, after the batches before it: wait while it runs
                if not self._threads or not self._threads[0].is_alive():
                    try:
                        item = out.get_nowait()  # put just before it ended
                        break
                    except queue.Empty:
                        raise RuntimeError("the loader's feeder thread is not running") from None
        if isinstance(item, _Failure):
            self.stop()  # the stream ended with the error: a new iteration restarts it
            raise item.error
        self.expected = self.plan.next_position(item.at)
        return item

    def stop(self, wait: float = 10.0) -> None:
        """Stop the threads; batches they had made are dropped (their slots are back already).
        Waits at most `wait` seconds: a thread stuck in a read ends on its own (daemon), and a
        later `stop` waits for it again."""
        threads = self._threads + self._left
        if not threads:
            return
        self._stop.set()
        deadline = time.monotonic() + wait
        for t in threads:
            while t.is_alive() and time.monotonic() < deadline:
                for q in self._queues:  # unblock a put
                    while True:
                        try:
                            q.get_nowait()
                        except queue.Empty:
                            break
                t.join(timeout=0.1)
        self._threads = []
        self._left = [t for t in threads if t.is_alive()]


def _put(
    out: queue.Queue[Any],
    item: Any,
    stop: threading.Event,
    waiting: Callable[[], None] | None = None,
) -> bool:
    """Put `item` on `out` unless `stop` is set first; `waiting()` runs while the queue is full."""
    while not stop.is_set():
        try:
            out.put(item, timeout=0.1 if waiting is None else 0.02)
            return True
        except queue.Full:
            if waiting is not None:
                waiting()
    return False
