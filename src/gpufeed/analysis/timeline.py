"""`Timeline`: what the time-based views of a run render (the HTML report's charts, the Perfetto
trace): the run's span, its timed training steps and its evaluation passes. Made by one call,
`timeline(run)`, without the rules, so that `gpufeed trace` renders a run without analyzing it
and no presenter computes these itself."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from gpufeed.analysis.stats import evaluation_passes, run_span
from gpufeed.errors import GpufeedError

if TYPE_CHECKING:
    import pandas as pd

    from gpufeed.analysis.frames import Run


@dataclass(frozen=True)
class Timeline:
    """A run's span and the steps and evaluation passes a timeline draws."""

    span: tuple[float, float]
    """The run's (start, end) in epoch seconds (`stats.run_span`; NaN where nothing says)."""
    steps: pd.DataFrame
    """The training steps with a known duration (`run.steps` rows)."""
    evals: pd.DataFrame
    """The evaluation passes with a known duration (`stats.evaluation_passes`)."""


def timeline(run: Run) -> Timeline:
    """`run`'s `Timeline`: its span, timed steps and evaluation passes."""
    steps = run.steps[np.isfinite(run.steps["duration"].to_numpy(dtype=float))]
    return Timeline(span=run_span(run), steps=steps, evals=evaluation_passes(run))


class WindowError(GpufeedError, ValueError):
    """A window of a run that holds nothing or is turned around; the message says the run's span."""


@dataclass(frozen=True)
class Window:
    """The part of a run between `lo` and `hi` (epoch seconds; the run spans `t0`-`t1`): the
    steps, evaluation passes and samples in it, and how long the steps and passes took (the mean
    over ranks of each rank's sum)."""

    t0: float
    t1: float
    lo: float
    hi: float
    steps: pd.DataFrame
    evals: pd.DataFrame
    system: pd.DataFrame
    processes: pd.DataFrame
    training_steps_s: float
    evaluation_s: float


def window(
    run: Run, line: Timeline, start: float | None = None, end: float | None = None
) -> Window:
    """`run` from `start` to `end` seconds after its start (default: all of it); WindowError
    where `end` is not after `start`, or where a window asked for holds no data."""
    t0, t1 = line.span
    if not math.isfinite(t0):
        t0 = t1 = 0.0
    if end is not None and start is not None and end <= start:
        raise WindowError(f"--end ({end:g} s) must be after --start ({start:g} s)")
    lo = t0 + (start or 0.0)
    hi = t0 + end if end is not None else max(t1, t0)
    steps = line.steps[(line.steps["end"] >= lo) & (line.steps["start"] <= hi)]
    evals = line.evals[(line.evals["end"] >= lo) & (line.evals["start"] <= hi)]
    system = run.system[(run.system["time"] >= lo) & (run.system["time"] <= hi)]
    procs = run.processes[(run.processes["time"] >= lo) & (run.processes["time"] <= hi)]
    if len(steps) == 0 and len(system) == 0 and (start is not None or end is not None):
        if lo > t1:
            raise WindowError(
                f"--start {start:g} s is past the run's end: it spans 0-{t1 - t0:.1f} s"
            )
        raise WindowError(
            f"the window {lo - t0:g}-{hi - t0:g} s holds no data; the run spans 0-{t1 - t0:.1f} s"
        )
    return Window(t0, t1, lo, hi, steps, evals, system, procs, _per_rank(steps), _per_rank(evals))


def _per_rank(frame: pd.DataFrame) -> float:
    """The mean over (host, rank) of each one's summed durations; 0 without rows."""
    if not len(frame):
        return 0.0
    return float(frame.groupby(["host", "rank"])["duration"].sum().mean())
