"""Which Loaders' feeder threads may still run, so that the interpreter's exit stops them.

A daemon thread still inside torch code when the interpreter finalizes aborts the process
("terminate called without an active exception", exit 134): Loaders left open (a loop that ends
or breaks without `close()`) are closed at exit, and feeders of Loaders freed mid-run (told to
stop without waiting) are waited for. Each is noted with the pid that started it: a forked
child's copy of its parent's Loader is not its own to stop.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import weakref
from typing import Any

from gpufeed.data.feeder import Feeder

# Loaders whose feeder may be running -> the pid of the process that started it
_OPEN: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
# Feeders told to stop without waiting (a Loader freed mid-run) -> the pid that started them
_STOPPING: dict[Feeder, int] = {}


def opened(loader: Any) -> None:
    """Note `loader`'s feeder as started by this process."""
    _OPEN[loader] = os.getpid()


def owner(loader: Any) -> int | None:
    """The pid of the process that started `loader`'s feeder, None where none runs."""
    return _OPEN.get(loader)


def stopped(loader: Any, feeder: Feeder) -> None:
    """`loader`'s `feeder` was told to stop: waited for at exit while it is still ending."""
    for done in [f for f in _STOPPING if not f.ending]:  # ended since
        _STOPPING.pop(done, None)
    if feeder.ending:
        _STOPPING[feeder] = _OPEN.get(loader, os.getpid())


def closed(loader: Any) -> None:
    """`loader` was closed: nothing of it to stop at exit."""
    _OPEN.pop(loader, None)


@atexit.register
def close_open_loaders() -> None:
    """Stop the feeder threads of Loaders still open when the interpreter exits, and wait for
    those of Loaders freed meanwhile (see the module docstring)."""
    for loader, pid in list(_OPEN.items()):
        if pid == os.getpid():  # not a forked child's copy of its parent's Loader
            with contextlib.suppress(Exception):
                loader.close(wait=5.0)
    for feeder, pid in list(_STOPPING.items()):
        if pid == os.getpid():
            with contextlib.suppress(Exception):
                feeder.stop(5.0)
