"""The thread's scheduler clock: CPU time, and time runnable but kept off a core by other load."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufeed.profiler.threadclock import between, reading

SCHEDSTAT = Path("/proc/thread-self/schedstat").exists()
needs_schedstat = pytest.mark.skipif(not SCHEDSTAT, reason="no /proc/thread-self/schedstat here")


def _busy(seconds: float) -> tuple[float, float, float]:
    """(wall, on a CPU, ready) of this thread spinning for `seconds`."""
    start, t0 = reading(), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        pass
    cpu, ready = between(start, reading())
    return time.perf_counter() - t0, cpu, ready


def test_cpu_time_is_thread_time_and_the_wait_for_a_core_is_schedstat_nanoseconds():
    start, end = (1.0, b"1000000000 500000000 7\n"), (3.5, b"1200000000 750000000 9\n")
    assert between(start, end) == (2.5, 0.25)  # schedstat's lagging CPU figure is not used
    cpu, ready = between(1.0, 1.75)  # only thread_time() was read: the wait for a core unknown
    assert cpu == 0.75 and math.isnan(ready)
    cpu, ready = between(start, 4.0)  # the file vanished between the two readings
    assert cpu == 3.0 and math.isnan(ready)


def test_a_thread_asleep_between_short_bursts_of_work_is_not_counted_on_a_cpu():
    # schedstat's CPU figure of a running thread lags by up to a scheduler tick: read at the
    # start of many 2 ms sleeps it said the thread was on a CPU for most of them
    on_cpu = waited = 0.0
    for i in range(100):
        t = time.perf_counter()
        while time.perf_counter() - t < 0.002 + 0.0001 * (i % 50):
            pass
        start, t0 = reading(), time.perf_counter()
        time.sleep(0.002)
        on_cpu += between(start, reading())[0]
        waited += time.perf_counter() - t0
    assert on_cpu <= 0.3 * waited, (on_cpu, waited)


def test_a_spinning_thread_is_busy_and_a_sleeping_one_is_not():
    wall, cpu, ready = _busy(0.3)
    assert cpu + (0.0 if math.isnan(ready) else ready) >= 0.8 * wall, (wall, cpu, ready)
    start, t0 = reading(), time.perf_counter()
    time.sleep(0.3)
    cpu, ready = between(start, reading())
    assert cpu + (0.0 if math.isnan(ready) else ready) <= 0.2 * (time.perf_counter() - t0)


@needs_schedstat
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")
def test_a_thread_sharing_its_core_with_another_process_waits_for_it():
    # This process and a spinning child pinned to one core: the thread gets part of the core and
    # is runnable, not asleep, for the rest; its CPU time alone would read as half asleep.
    saved = os.sched_getaffinity(0)
    core = min(saved)
    spin = f"import os; os.sched_setaffinity(0, {{{core}}}); print(flush=True)\nwhile True: pass"
    child = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "\n"  # pinned and about to spin
        os.sched_setaffinity(0, {core})
        wall, cpu, ready = _busy(0.5)
    finally:
        os.sched_setaffinity(0, saved)
        child.kill()
        child.wait()
    assert ready >= 0.1 * wall, (wall, cpu, ready)
    assert cpu + ready >= 0.8 * wall, (wall, cpu, ready)


def _child_reading(queue) -> None:
    queue.put(reading())


@needs_schedstat
def test_a_forked_child_reads_its_own_thread_not_the_parents():
    import multiprocessing

    before = reading()  # the parent's file is open when it forks
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_reading, args=(queue,))
    child.start()
    theirs = queue.get(timeout=60)
    child.join(timeout=60)
    parent_cpu, _ = between((0.0, b"0 0 0\n"), before)  # since the thread started: imports, tests
    child_cpu, _ = between((0.0, b"0 0 0\n"), theirs)
    assert child_cpu < 0.5 * parent_cpu, (child_cpu, parent_cpu)  # a fresh task's clock
