"""Loader workers: processes that make whole batches into host slots, running on across epochs.

Each worker is told once where the stream starts ("go": generation, position) and from then on
makes its batches of the plan (`BatchPlan.worker_batches`) epoch after epoch, as fast as it gets
free slots back: the next epoch's first batches are made while the training loop finishes the
current one. A new "go" (another epoch than planned, a resumed state) starts a new generation;
batches of older generations are dropped by the main process and their slots given back.
Workers run at a lower CPU priority than the training process, so the loop that feeds the GPU is
never starved by the work that feeds it. With `num_workers=0` the same plan runs in the caller's
thread (`InlinePool`). A worker's exception is sent back with its traceback and the batch's shards
and keys, and raised at that batch as the same type (`worker_errors`); a worker that dies, or
that makes no progress within `worker_timeout` (`watchdog`), is a LoaderWorkerError naming it.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import multiprocessing as mp
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any, Protocol

import torch

from gpufeed.data.dataset import RawSample
from gpufeed.data.forking import frozen_heap
from gpufeed.data.plan import BatchPlan, Position
from gpufeed.data.produce import fill_slot
from gpufeed.data.slot_meta import SlotMeta
from gpufeed.data.slots import Slots
from gpufeed.data.watchdog import Progress, Watchdog
from gpufeed.data.worker_errors import LoaderWorkerError, WorkerFailure, describe_batch, note_batch

__all__ = ["InlinePool", "LoaderWorkerError", "Pool", "Stopped", "WorkerPool"]

POLL_S = 0.2  # how often a waiting side checks that the other is still alive


class Pool(Protocol):
    """Where the feeder takes made batches from: `WorkerPool` (local processes), `InlinePool`
    (the calling thread) or `remote.RayPool` (Ray actors)."""

    processes: list[Any]

    def start(self, at: Position) -> None: ...

    def get(self, at: Position, stop: threading.Event) -> tuple[int, int, SlotMeta]: ...

    def free(self, worker: int, slot: int) -> None: ...

    @property
    def pids(self) -> list[int]: ...

    def close(self) -> None: ...


class Stopped(Exception):
    """The caller asked the waiting side to stop (internal)."""


def _worker_main(
    worker: int,
    conn: Any,
    plan: BatchPlan,
    slots: Slots,
    nice: int,
    parent: int,
    progress: Progress,
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the training process's to handle
    torch.set_num_threads(1)
    if nice:
        with contextlib.suppress(OSError):
            os.nice(nice)
    gc.freeze()  # the training process's objects, forked: never traversed (or copied) by gc
    ds = plan.dataset
    note = progress.note(worker)
    free = list(range(slots.per_worker))
    gen = 0
    stream: Iterator[tuple[Position, list[RawSample]]] | None = None
    while True:
        while True:  # take every message waiting; wait for one while there is nothing to do
            idle = stream is None or not free
            if not conn.poll(POLL_S if idle else 0):
                if not idle:
                    break
                if os.getppid() != parent:
                    return  # the training process is gone
                continue
            msg = conn.recv()
            if msg[0] == "stop":
                return
            if msg[0] == "free":
                free.append(msg[1])
            elif msg[0] == "go":
                if stream is not None:
                    stream.close()  # type: ignore[attr-defined]
                gen, stream = msg[1], plan.worker_batches(worker, msg[2])
        assert stream is not None
        k = free.pop(0)
        at = samples = None
        note.reading()
        try:
            at, samples = next(stream)
            note.making(at, samples)
            meta = fill_slot(samples, at, slots, slots.index(worker, k), ds.seed, ds.rank)
            meta = replace(meta, retried=ds.source.new_retries())
        except Exception as e:
            free.append(k)
            stream = None  # wait for the next "go"
            where = f"loader worker {worker} (pid {os.getpid()})"
            conn.send(("error", gen, WorkerFailure.of(e, where, describe_batch(at, samples))))
            note.waiting()
            continue
        conn.send(("batch", gen, at, k, meta))
        note.made()


class WorkerPool:
    """`num_workers` worker processes over one plan and one set of slots (main-process side).
    `timeout`: the `worker_timeout` option (`watchdog`)."""

    def __init__(
        self, plan: BatchPlan, slots: Slots, *, nice: int = 5, timeout: float | None = None
    ) -> None:
        self.plan, self.slots, self.gen = plan, slots, 0
        self.watchdog = Watchdog(plan.workers, timeout)
        method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
        ctx = mp.get_context(method)
        self.conns: list[Any] = []
        self.processes: list[Any] = []
        with frozen_heap():  # a child never finalizes the parent's objects (see forking)
            for w in range(plan.workers):
                mine, theirs = ctx.Pipe(duplex=True)
                p = ctx.Process(
                    target=_worker_main,
                    args=(w, theirs, plan, slots, nice, os.getpid(), self.watchdog.progress),
                    name=f"gpufeed-loader-{w}",
                    daemon=True,
                )
                p.start()
                theirs.close()
                self.conns.append(mine)
                self.processes.append(p)

    def start(self, at: Position) -> None:
        """Every worker starts (again) from `at`; batches made before are dropped."""
        self.gen += 1
        for w, conn in enumerate(self.conns):
            try:
                conn.send(("go", self.gen, at))
            except OSError:
                self._raise_dead(w)

    def get(self, at: Position, stop: threading.Event) -> tuple[int, int, SlotMeta]:
        """(worker, slot, meta) of batch `at`; waits for it, raising the worker's error if it
        failed, LoaderWorkerError if it died or made no progress within the deadline, Stopped
        once `stop` is set."""
        w = self.plan.worker_of(at)
        conn = self.conns[w]
        watch = self.watchdog.watch(w)
        while True:
            if not conn.poll(POLL_S):
                if stop.is_set():
                    raise Stopped
                self._check_alive(w)
                watch.check(self.processes[w].pid, at)
                continue
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                self._raise_dead(w)
            if msg[1] != self.gen:  # made for an abandoned stream
                if msg[0] == "batch":
                    self.free(w, msg[3])
                continue
            if msg[0] == "error":  # the worker's exception, with its traceback and samples
                raise msg[2].error()
            _, _, got, slot, meta = msg
            if got != at:
                raise LoaderWorkerError(f"loader worker {w} made batch {got}, expected {at}")
            return w, slot, meta

    def free(self, worker: int, slot: int) -> None:
        """Give slot `slot` back to `worker`."""
        with contextlib.suppress(OSError):
            self.conns[worker].send(("free", slot))

    def _check_alive(self, w: int) -> None:
        if not self.processes[w].is_alive():
            self._raise_dead(w)

    def _raise_dead(self, w: int) -> None:
        """Raise the error for worker `w`, whose pipe broke: named with its pid and exit."""
        p = self.processes[w]
        p.join(timeout=5)  # its pipe can close just before it can be reaped
        code = p.exitcode
        if code is None:
            why = "closed its pipe but is still running"
        elif code < 0:
            why = f"was killed by signal {-code}"
        else:
            why = f"exited with code {code}"
        hint = " (out of memory? see dmesg)" if code == -signal.SIGKILL else ""
        raise LoaderWorkerError(f"loader worker {w} (pid {p.pid}) {why}{hint}") from None

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def close(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError, ValueError):
                conn.send(("stop",))
        for p in self.processes:
            p.join(timeout=2)
            if p.is_alive():
                p.terminate()
                p.join(timeout=2)
            if p.is_alive():  # stopped (SIGSTOP) or stuck: SIGTERM waits until it runs again
                p.kill()
                p.join(timeout=2)
        for conn in self.conns:
            conn.close()
        self.conns, self.processes = [], []


class InlinePool:
    """`num_workers=0`: the plan's batches are made in the calling thread, into two slots."""

    def __init__(self, plan: BatchPlan, slots: Slots) -> None:
        mine = copy.copy(plan.dataset)  # set_epoch on the copy leaves the loader's own alone
        self.plan = BatchPlan(mine, plan.batch_size, 1, plan.drop_last, plan.remainder)
        self.slots = slots
        self.processes: list[Any] = []
        self._stream: Iterator[tuple[Position, list[RawSample]]] | None = None
        self._start: Position | None = None
        self._next_slot = 0

    def start(self, at: Position) -> None:
        if self._stream is not None:
            with contextlib.suppress(ValueError):  # still running on a feeder being stopped
                self._stream.close()  # type: ignore[attr-defined]
        self._stream, self._start = None, at

    def get(self, at: Position, stop: threading.Event) -> tuple[int, int, SlotMeta]:
        if stop.is_set():
            raise Stopped
        if self._stream is None:
            assert self._start is not None
            self._stream = self.plan.worker_batches(0, self._start)
        ds = self.plan.dataset
        got = samples = None
        try:
            got, samples = next(self._stream)
            if got != at:
                raise LoaderWorkerError(f"inline loader made batch {got}, expected {at}")
            k, self._next_slot = self._next_slot, (self._next_slot + 1) % self.slots.per_worker
            meta = fill_slot(samples, at, self.slots, k, ds.seed, ds.rank)
        except Exception as e:
            note_batch(e, got, samples)  # its own traceback: the batch and samples as a note
            raise
        return 0, k, replace(meta, retried=ds.source.new_retries())

    def free(self, worker: int, slot: int) -> None:
        pass

    @property
    def pids(self) -> list[int]:
        return []

    def close(self) -> None:
        self.start(Position(0, 0))
