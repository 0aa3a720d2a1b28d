"""Helpers for tests that watch real processes: wait for a condition, tell whether a pid is gone."""

from __future__ import annotations

import time
from collections.abc import Callable

import psutil


def wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> bool:
    """Poll `condition` until it holds or `timeout` seconds pass; returns whether it held."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def gone(pid: int) -> bool:
    """The process has exited (a zombie that nobody reaps counts as exited)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
