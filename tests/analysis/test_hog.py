"""tests/hog.py: the CPU hog the verdict tests run beside keeps a core busy and always stops."""

from __future__ import annotations

import time

import psutil
import pytest

from hog import cpu_hog


def test_the_hog_spins_on_a_core_and_is_gone_afterwards() -> None:
    with cpu_hog() as hog:
        before = sum(hog.cpu_times()[:2])
        until = time.monotonic() + 30
        while sum(hog.cpu_times()[:2]) - before < 0.2:  # CPU time accrues: it spins
            assert time.monotonic() < until, "the hog used no CPU"
            time.sleep(0.02)
        pid = hog.pid
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_the_hog_stops_when_the_block_fails() -> None:
    with pytest.raises(RuntimeError), cpu_hog() as hog:
        pid = hog.pid
        raise RuntimeError("a failing test")
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
