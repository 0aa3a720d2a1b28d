"""`cpu_hog()`: another process keeping one core busy for as long as a test needs a busy machine.

Verdicts must hold on a shared machine: the tests that assert them run a scenario once quiet and
once beside this hog. It is a separate process (its own interpreter, no GIL shared with the test)
spinning a pure-Python loop, not pinned, so the scheduler moves it about as it would another job.
It is always stopped, whatever the test does (a context manager; its process dies with the test
run as well, since it reads its stdin and quits when that closes).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psutil

# Spins until its stdin closes: a thread blocked on the read, the main thread in the busy loop.
_SPIN = """
import sys, threading
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
print("spinning", flush=True)
x = 0
while not done.is_set():
    for _ in range(100_000):
        x += 1
"""


@contextmanager
def cpu_hog(deadline: float = 30.0) -> Iterator[psutil.Process]:
    """Keep one core busy in another process while the block runs; yields that process.

    Returns once the hog is seen using CPU (within `deadline` seconds), so that what the block
    measures is measured beside it; stops it on the way out, killing it if it does not quit."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _SPIN],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "spinning\n"
        hog = psutil.Process(proc.pid)
        until = time.monotonic() + deadline
        while sum(hog.cpu_times()[:2]) < 0.05:  # on a CPU, not just started
            assert time.monotonic() < until, "the CPU hog never got a core"
            time.sleep(0.01)
        yield hog
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
