"""The calling thread's scheduler clock: its CPU time, and its time ready to run but kept off a core.

While a training thread waits for data it either works (decodes the batch itself, unpickles what its
workers send) or sleeps (on workers, on storage). Working on a busy host means partly on a CPU and
partly runnable, waiting for a free core; the CPU time alone then reads like sleep. Linux keeps both
per thread in /proc/thread-self/schedstat (ns on a CPU, ns waiting on a run queue), read here with
one `pread` of a file opened once per thread (about 1 us). Its CPU figure of a running thread is
only brought up to date at scheduler ticks and switches (it lags by up to a tick, ~2 ms on average
in a short wait), so the CPU time is `time.thread_time()`, which the kernel brings up to date, and
only the wait for a core comes from schedstat (it changes only while the thread is off a core).
Elsewhere the wait for a core is unknown. A reading is kept raw, so the hot path only reads;
`between` parses two of them later, on the flush thread.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time

_SCHEDSTAT = "/proc/thread-self/schedstat"
_local = threading.local()


class _Stat:
    """This thread's schedstat file, open for `pread` (fd -1: not available here)."""

    def __init__(self) -> None:
        self.fd = -1
        try:
            fd = os.open(_SCHEDSTAT, os.O_RDONLY)
        except OSError:
            return
        try:
            _parse(os.pread(fd, 64, 0))
        except (OSError, ValueError, IndexError):
            os.close(fd)
            return
        self.fd = fd

    def __del__(self) -> None:  # the thread ended, or this is a forked child's copy
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)


def reading() -> tuple[float, bytes] | float:
    """Now, for `between`: `time.thread_time()` and the thread's schedstat line, or the first
    alone where there is no such line."""
    stat = getattr(_local, "stat", None)
    if stat is None:
        stat = _local.stat = _Stat()
    if stat.fd >= 0:
        try:
            return time.thread_time(), os.pread(stat.fd, 64, 0)
        except OSError:
            stat.fd = -1
    return time.thread_time()


def _forget() -> None:
    """In a forked child: the file open in the parent names the parent's thread; open anew."""
    _local.__dict__.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget)


def between(
    start: tuple[float, bytes] | float, end: tuple[float, bytes] | float
) -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for a core) from `start` to `end`, two
    `reading`s of one thread; the second is NaN where schedstat was not read at both."""
    if isinstance(start, tuple) and isinstance(end, tuple):
        return end[0] - start[0], (_parse(end[1])[1] - _parse(start[1])[1]) / 1e9
    cpu0 = start[0] if isinstance(start, tuple) else start
    cpu1 = end[0] if isinstance(end, tuple) else end
    return cpu1 - cpu0, math.nan  # the file vanished between the two readings


def _parse(line: bytes) -> tuple[int, int]:
    """(ns on a CPU, ns waiting on a run queue) from a schedstat line."""
    on_cpu, waiting, _ = line.split()
    return int(on_cpu), int(waiting)
