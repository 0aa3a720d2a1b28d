"""`timed(batches)`: a scenario's own account of its data wait, to check gpufeed's against.

Times each `next()` on the loader (the wait for a batch) and each whole step (from one `next()` to
the following one) with perf_counter, apart from gpufeed's hooks, and writes them as JSON to the
file that $SCENARIO_MEASURED names once the loop ends ({"waits": [...], "steps": [...]}, seconds,
one entry a step). Without the variable it only passes the batches through.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
ENV = "SCENARIO_MEASURED"


def timed(batches: Iterable[T]) -> Iterator[T]:
    """Yield the batches of `batches`, timing the wait for each and each step."""
    path = os.environ.get(ENV)
    if not path:
        yield from batches
        return
    waits: list[float] = []
    steps: list[float] = []
    it = iter(batches)
    began = time.perf_counter()
    while True:
        try:
            batch = next(it)
        except StopIteration:
            break
        waits.append(time.perf_counter() - began)
        yield batch
        now = time.perf_counter()
        steps.append(now - began)
        began = now
    with open(path, "w") as f:
        json.dump({"waits": waits, "steps": steps}, f)
