"""Stuck loader workers: a worker that makes no progress is named, never waited for without end.

Each worker process notes in shared memory what it is doing, at every step of a batch (`Note`:
reading its next batch's samples, making batch (epoch, j) from shard S key K to shard S' key
K', waiting for a slot), a few integer stores per batch, and how long its slowest batch took.
While the feeder waits for a worker's batch (`WorkerPool.get`) it watches that worker's count of
steps (`Watch`): if it stands still longer than the deadline, the wait ends in a
`LoaderWorkerError` that names the worker, its pid and process state (a stopped process: "kill
-CONT" it), what it was last doing and the `worker_timeout` option that set the deadline.

`worker_timeout=None` (the default) is automatic: `AUTO_FACTOR` × the slowest batch any worker
has made so far, at least `AUTO_FLOOR_S` (the first batch of a stream, before anything is
measured, reads a shuffle buffer's worth of samples and may open remote shards). A number is that
many seconds, and 0 waits without end, as torch's DataLoader(timeout=0). Only the time the
training process spends waiting counts: a worker idle while the training loop is busy elsewhere
(an evaluation) is not stuck. `remote.RayPool` applies the same deadline to each batch it asks
of a Ray actor (`deadline`, `what_to_do`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from gpufeed.data.options import finite
from gpufeed.data.slots import shared_zeros
from gpufeed.data.worker_errors import LoaderWorkerError
from gpufeed.errors import OptionError
from gpufeed.text import visible

if TYPE_CHECKING:
    from gpufeed.data.dataset import RawSample
    from gpufeed.data.plan import Position

AUTO_FLOOR_S = 120.0  # the automatic deadline's least, and all of it before a batch is measured
AUTO_FACTOR = 10.0  # the automatic deadline: this many times the slowest batch so far

STARTING, WAITING, READING, MAKING = range(4)  # what a worker is doing (its `PHASE`)
# one row of int64 per worker: steps taken, phase, the batch (epoch, j) and size last made, its
# slowest batch (µs), the length of its text (shard and key of that batch's first, last sample)
BEAT, PHASE, EPOCH, BATCH, SIZE, SLOWEST_US, TEXT_LEN, _FIELDS = range(8)
TEXT_BYTES = 512


def timeout_option(value: Any) -> float | None:
    """Check `worker_timeout`: None (automatic), 0 (wait without end) or seconds > 0."""
    if value is None:
        return None
    seconds = finite(value)
    if seconds is None or seconds < 0:
        raise OptionError(
            f"worker_timeout={value!r}: give the seconds to wait for a loader worker that makes "
            "no progress (a number > 0), 0 to wait without end, or None for the automatic "
            f"deadline ({AUTO_FACTOR:g}× the slowest batch so far, at least {AUTO_FLOOR_S:g} s)"
        )
    return seconds


class Progress:
    """The shared record of what each of `workers` workers is doing (made before the fork)."""

    def __init__(self, workers: int) -> None:
        import torch

        self.ints = shared_zeros((workers, _FIELDS), torch.int64)
        self.text = shared_zeros((workers, TEXT_BYTES), torch.uint8)

    def note(self, worker: int) -> Note:
        """The writer of `worker`'s row, for the worker process itself."""
        return Note(self.ints.numpy()[worker], self.text.numpy()[worker])

    def beat(self, worker: int) -> int:
        return int(self.ints[worker, BEAT])

    def slowest(self) -> float:
        """Seconds of the slowest batch any worker has made so far (0 before the first)."""
        return int(self.ints[:, SLOWEST_US].max()) / 1e6

    def doing(self, worker: int) -> str:
        """What `worker` was last seen doing, in words."""
        row = [int(x) for x in self.ints[worker]]
        phase, n = row[PHASE], row[SIZE]
        raw = bytes(self.text[worker, : row[TEXT_LEN]].numpy()).decode("utf-8", "replace")
        first_shard, first_key, last_shard, last_key = (raw.split("\0") + ["?"] * 4)[:4]
        made = f"batch {row[BATCH]} of epoch {row[EPOCH]}"
        if n == 1:
            samples = f"1 sample: shard {first_shard}, key {first_key}"
        else:
            samples = (
                f"{n} samples, from shard {first_shard}, key {first_key} to shard "
                f"{last_shard}, key {last_key}"
            )
        if phase == STARTING:
            return "starting (it had made no batch yet)"
        if phase == MAKING:
            return f"making {made} ({visible(samples)})"
        if n == 0:  # before its first batch was made
            if phase == READING:
                return "reading the samples of its first batch"
            return "waiting for work (it had made no batch yet)"
        after = f"after {made}, whose last sample was shard {last_shard}, key {last_key}"
        if phase == READING:
            return f"reading the samples of its next batch ({visible(after)})"
        return f"waiting for a free slot or for work ({visible(after)})"


class Note:
    """One worker's row of the `Progress` record, written by that worker: a few stores a batch."""

    def __init__(self, ints: np.ndarray, text: np.ndarray) -> None:
        self.ints, self.text = ints, text
        self.started = 0.0
        self.slowest = 0.0

    def _step(self, phase: int) -> None:
        self.ints[PHASE] = phase
        self.ints[BEAT] += 1

    def reading(self) -> None:
        """The worker starts reading its next batch's samples."""
        self.started = time.monotonic()
        self._step(READING)

    def making(self, at: Position, samples: Sequence[RawSample]) -> None:
        """The worker has the samples of batch `at` and starts decoding them into a slot."""
        ints = self.ints
        ints[EPOCH], ints[BATCH], ints[SIZE] = at.epoch, at.batch, len(samples)
        if samples:
            first, last = samples[0], samples[-1]
            raw = "\0".join((first.shard, first.key, last.shard, last.key)).encode(
                "utf-8", "replace"
            )[:TEXT_BYTES]
            self.text[: len(raw)] = np.frombuffer(raw, np.uint8)
            ints[TEXT_LEN] = len(raw)
        self._step(MAKING)

    def made(self) -> None:
        """The batch is in its slot and sent: note how long it took."""
        took = time.monotonic() - self.started
        if took > self.slowest:
            self.slowest = took
            self.ints[SLOWEST_US] = int(took * 1e6)
        self._step(WAITING)

    def waiting(self) -> None:
        """The worker has nothing to do (it sent an error, or waits for a slot)."""
        self._step(WAITING)


class Watchdog:
    """The training-process side: the `Progress` record and the `worker_timeout` deadline."""

    def __init__(self, workers: int, timeout: float | None) -> None:
        self.progress = Progress(workers)
        self.timeout = timeout

    def deadline(self) -> float | None:
        """Seconds a worker may go without progress while its batch is waited for (None: no
        end)."""
        return deadline(self.timeout, self.progress.slowest())

    def watch(self, worker: int) -> Watch:
        """Start watching `worker` while its batch is waited for."""
        return Watch(self, worker)

    def stuck(
        self, worker: int, pid: int, at: Position, idle: float, limit: float
    ) -> LoaderWorkerError:
        """The error for `worker` (process `pid`), which made no progress for `idle` seconds
        while batch `at` was waited for."""
        state, hint = process_state(pid)
        return LoaderWorkerError(
            f"loader worker {worker} (pid {pid}, process state: {state}) made no progress for "
            f"{idle:.1f} s while the training loop waited for batch {at.batch} of epoch "
            f"{at.epoch}; it was last {self.progress.doing(worker)}.{hint} "
            + what_to_do(self.timeout, self.progress.slowest(), limit)
        )


def deadline(timeout: float | None, slowest: float) -> float | None:
    """The deadline `worker_timeout=timeout` sets, the slowest batch so far taking `slowest`
    seconds (None: no end)."""
    if timeout is not None:
        return timeout or None
    return max(AUTO_FLOOR_S, AUTO_FACTOR * slowest)


def what_to_do(timeout: float | None, slowest: float, limit: float) -> str:
    """The end of a stuck worker's message: which option set the deadline `limit`, and how."""
    if timeout is None:
        rule = (
            f"The automatic worker_timeout ({AUTO_FACTOR:g}× the slowest batch so far, "
            f"{slowest:.2g} s, at least {AUTO_FLOOR_S:g} s) set this deadline"
        )
    else:
        rule = f"worker_timeout={timeout:g} set this deadline"
    return (
        f"{rule}; set Loader(worker_timeout=SECONDS) above {limit:g} to wait longer, or "
        "worker_timeout=0 to wait without end"
    )


class Watch:
    """One wait for a worker's batch: `check` raises once its steps stand still too long."""

    def __init__(self, dog: Watchdog, worker: int) -> None:
        self.dog, self.worker = dog, worker
        self.beat = dog.progress.beat(worker)
        self.since = time.monotonic()

    def check(self, pid: int, at: Position) -> None:
        """Raise LoaderWorkerError if the worker made no progress within the deadline."""
        now, beat = time.monotonic(), self.dog.progress.beat(self.worker)
        if beat != self.beat:
            self.beat, self.since = beat, now
            return
        limit = self.dog.deadline()
        if limit is not None and now - self.since > limit:
            raise self.dog.stuck(self.worker, pid, at, now - self.since, limit)


def process_state(pid: int) -> tuple[str, str]:
    """The process's state as psutil names it, and a hint for the states a user can act on."""
    try:
        import psutil

        status = str(psutil.Process(pid).status())
    except Exception:  # gone meanwhile, or psutil cannot read it here
        return "unknown", ""
    if status in ("stopped", "tracing-stop"):
        return status, (
            f" It is stopped (SIGSTOP, Ctrl-Z or a debugger): `kill -CONT {pid}` resumes it."
        )
    if status == "disk-sleep":
        return status, " It waits in the kernel for I/O (a file system or device that hangs?)."
    return status, ""
