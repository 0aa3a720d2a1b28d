"""The one progress reporter of long work (`pack`, `index`): a live bar on a terminal, plain lines
in a log (stderr to a file or a pipe: a batch job's, CI's), or nothing.

`with reporting(enabled, total, "packing", unit="images") as advance:` then `advance(n)` per unit
done. A log gets a line at every whole 10% of the total and at least every `LINE_EVERY_S`
seconds: done/total, the share, the rate and the time left. A reader that leaves (`2>&1 | head`)
stops the lines, never the work."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from gpufeed.text import MB, figure

LINE_EVERY_S = 30.0  # seconds between two plain progress lines (also one per 10% of the total)


@contextmanager
def reporting(
    enabled: bool, total: int, what: str, unit: str = "items", done: int = 0
) -> Iterator[Callable[[int], None]]:
    """`advance(n=1)` for `total` units of `what` (e.g. "packing"), of which `done` are done
    already; `unit="bytes"` shows megabytes and a transfer rate."""
    if not enabled or total <= 0:
        yield lambda n=1: None
        return
    from rich.console import Console

    console = Console(stderr=True)  # stdout keeps only the summary, e.g. for a file
    if not console.is_terminal:
        yield _Lines(total, done, what, unit).advance
        return
    with _bar(console, total, done, what, unit) as advance:
        yield advance


@contextmanager
def _bar(
    console: object, total: int, done: int, what: str, unit: str
) -> Iterator[Callable[[int], None]]:
    """A transient rich bar: counts and time left, or for bytes their size and speed."""
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    columns = (
        (DownloadColumn(), TransferSpeedColumn()) if unit == "bytes" else (MofNCompleteColumn(),)
    )
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        *columns,
        TimeRemainingColumn(),
        transient=True,
        console=console,  # type: ignore[arg-type]
    ) as bar:
        task = bar.add_task(what, total=total, completed=done)
        yield lambda n=1: bar.advance(task, n)


class _Lines:
    """Progress as plain stderr lines, for a log where a live bar shows nothing."""

    def __init__(self, total: int, done: int, what: str, unit: str) -> None:
        self.total, self.done, self.first, self.what, self.unit = total, done, done, what, unit
        self.start = self.last = time.monotonic()
        self.mark = self._next_mark()
        self.shown = True  # False once stderr is gone (a closed pipe): the work goes on

    def _next_mark(self) -> int:
        """The next count that is a whole 10% of the total."""
        return math.ceil(self.total * (self.done * 10 // self.total + 1) / 10)

    def advance(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if not self.shown or (self.done < self.mark and now - self.last < LINE_EVERY_S):
            return
        self.last, self.mark = now, self._next_mark()
        rate = (self.done - self.first) / max(now - self.start, 1e-9)
        share = 100 * self.done // self.total
        if self.unit == "bytes":
            line = (
                f"{self.what}: {figure(self.done / MB)}/{figure(self.total / MB)} MB ({share}%), "
                f"{figure(rate / MB)} MB/s"
            )
        else:
            line = (
                f"{self.what}: {self.done:,}/{self.total:,} {self.unit} ({share}%), "
                f"{figure(rate)} {self.unit}/s"
            )
        if self.done < self.total and rate > 0:
            line += f", about {duration((self.total - self.done) / rate)} left"
        try:
            print(line, file=sys.stderr, flush=True)
        except OSError:  # `pack ... 2>&1 | head`: the reader left; progress is not worth a stop
            self.shown = False


def duration(seconds: float) -> str:
    """'45 s', '12 min' or '3.4 h'."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"
