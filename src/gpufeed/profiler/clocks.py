"""Clocks that time a step's phases: the host clock (perf_counter) and the CUDA-event clock.

On a GPU the host only launches kernels, so host times measure launches, not GPU work. The CUDA
clock records timing events on the current stream at the same points and reads them later, on the
flush thread, once `Event.query()` says they are done: never a host sync, never `elapsed_time` on
an unfinished event. `Spans` keeps each step's marks until every one of them is ready.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterable
from typing import Any, Protocol

# Timing events a CUDA clock makes at most (each is a few hundred bytes of host memory).
MAX_EVENTS = 65536
# Steps whose marks may wait to be read at most; older ones are dropped and counted.
MAX_PENDING = 4096


class Clock(Protocol):
    """What `Spans` needs of a clock: marks taken now, read when ready, then given back."""

    def mark(self) -> Any:
        """A mark of now; None when none can be taken (the clock is at its cap)."""

    def ready(self, mark: Any) -> bool:
        """Whether `mark` can be read without waiting."""

    def seconds(self, begin: Any, end: Any) -> float:
        """Seconds from `begin` to `end` (both ready)."""

    def release(self, mark: Any) -> None:
        """`mark` is read or dropped: the clock may reuse it."""


class HostClock:
    """Host time: a mark is `time.perf_counter()`, ready at once."""

    mark = staticmethod(time.perf_counter)

    def ready(self, mark: Any) -> bool:
        """Always: a host time is known when it is taken."""
        return True

    def seconds(self, begin: float, end: float) -> float:
        """`end - begin`."""
        return end - begin

    def release(self, mark: Any) -> None:
        """Nothing to give back."""


class CudaClock:
    """GPU time: a mark is a `torch.cuda.Event(enable_timing=True)` recorded on the current stream.

    Events come from a pool and go back to it once read, so a steady run allocates none per step;
    past `capacity` events in flight `mark()` returns None (that span stays unmeasured).
    """

    def __init__(self, cuda: Any, capacity: int = MAX_EVENTS) -> None:
        self._cuda = cuda
        self._free: deque[Any] = deque()
        self._capacity = capacity
        self.made = 0

    def mark(self) -> Any:
        """Record an event on the current stream now (training thread); None at the cap."""
        try:
            event = self._free.pop()
        except IndexError:
            if self.made >= self._capacity:
                return None
            event = self._cuda.Event(enable_timing=True)
            self.made += 1
        event.record()
        return event

    def ready(self, mark: Any) -> bool:
        """`Event.query()`: the stream has passed the event (it never waits)."""
        return bool(mark.query())

    def seconds(self, begin: Any, end: Any) -> float:
        """GPU milliseconds between two completed events, as seconds."""
        return begin.elapsed_time(end) / 1000.0

    def release(self, mark: Any) -> None:
        """Back to the pool (deque appends are atomic: the training thread may be taking one)."""
        self._free.append(mark)


class Spans:
    """Marks of steps waiting to be read, oldest first; resolved in order once all are ready.

    `add(key, spans, owned)`: spans are (name, begin, end) marks; `owned` the marks this entry gives
    back to the clock, each once however often listed (a mark may be shared with the next entry: the
    previous step's end is the next one's start). An entry's marks are released only after the NEXT entry is read or dropped, so a
    shared mark is never reused while someone still needs it. Beyond `capacity` entries the oldest
    is dropped and counted in `dropped`.
    """

    def __init__(self, clock: Clock, capacity: int = MAX_PENDING) -> None:
        self.clock = clock
        self.dropped = 0
        self._capacity = capacity
        self._pending: deque[tuple[Any, list[tuple[str, Any, Any]], tuple[Any, ...]]] = deque()
        self._held: tuple[Any, ...] = ()

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, key: Any, spans: list[tuple[str, Any, Any]], owned: Iterable[Any]) -> None:
        """Queue one entry's spans; drop (and count) the oldest beyond the capacity."""
        unique = {id(m): m for m in owned if m is not None}  # a mark given back twice would be
        self._pending.append((key, spans, tuple(unique.values())))  # handed out twice
        while len(self._pending) > self._capacity:
            self._leave(self._pending.popleft()[2])
            self.dropped += 1

    def resolve(self) -> list[tuple[Any, dict[str, float]]]:
        """(key, {name: summed seconds}) for the leading entries whose marks are all ready.

        A span whose marks are missing (None) or fail to read is left out; it never raises."""
        clock = self.clock
        out = []
        while self._pending:
            key, spans, owned = self._pending[0]
            try:
                if not all(clock.ready(m) for m in owned):
                    break  # later entries were recorded later: not done either
                sums: dict[str, float] = {}
                for name, begin, end in spans:
                    if begin is None or end is None:
                        continue
                    seconds = clock.seconds(begin, end)
                    if math.isfinite(seconds) and seconds >= 0:
                        sums[name] = sums.get(name, 0.0) + seconds
            except Exception:
                sums = {}  # a mark that cannot be read leaves its entry unmeasured
            self._pending.popleft()
            self._leave(owned)
            out.append((key, sums))
        return out

    def _leave(self, owned: tuple[Any, ...]) -> None:
        for mark in self._held:
            self.clock.release(mark)
        self._held = owned
