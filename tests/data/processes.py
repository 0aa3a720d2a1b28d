"""Helpers for tests that watch real processes: wait for a condition, tell whether a pid is gone."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

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


class Haunted:
    """A garbage cycle (only a collector frees it) that writes down which process finalized it,
    as a DALI pipeline left to the collector shuts down its threads when finalized."""

    def __init__(self, diary: Path) -> None:
        self.diary, self.me = diary, self

    def __del__(self) -> None:
        with open(self.diary, "a") as f:
            f.write(f"{os.getpid()}\n")
