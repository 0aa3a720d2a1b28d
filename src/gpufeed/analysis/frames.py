"""`Run` (a run's frames and meta), `RunError` and `add_relative_time`: what `run` (reading one
run directory) and `combine` (several as one) both build on, so that neither imports the other.
`gpufeed.analysis.run` re-exports them: import them from there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufeed.analysis import schema
from gpufeed.errors import GpufeedError

if TYPE_CHECKING:
    import pandas as pd

SYSTEM_COLUMNS = schema.columns(schema.SYSTEM)
STEP_COLUMNS = schema.columns(schema.STEPS)
EVAL_COLUMNS = schema.columns(schema.EVALS)
PROCESS_COLUMNS = schema.columns(schema.PROCESSES)


class RunError(GpufeedError, ValueError):
    """A path that is not a readable run directory; the message says which and what to do."""


@dataclass
class Run:
    """One profiled run: the frames and meta of `gpufeed.analysis.schema`."""

    path: Path
    meta: dict[str, Any]
    system: pd.DataFrame
    steps: pd.DataFrame
    processes: pd.DataFrame
    workers: dict[str, set[int]] = field(default_factory=dict, repr=False)
    evals: pd.DataFrame = field(default_factory=lambda: frame([], EVAL_COLUMNS), repr=False)
    headspace: pd.DataFrame = field(default_factory=lambda: frame([], STEP_COLUMNS), repr=False)

    def __repr__(self) -> str:
        return (
            f"Run({str(self.path)!r}, steps={len(self.steps)}, system={len(self.system)}, "
            f"processes={len(self.processes)}, finished={self.meta.get('finished')})"
        )

    def recorded_span(self) -> tuple[float, float] | None:
        """(first, last) time anything was recorded: steps, system and process samples; None
        where nothing was."""
        times = [
            float(t)
            for frame, first, last in (
                (self.steps, "start", "end"),
                (self.system, "time", "time"),
                (self.processes, "time", "time"),
            )
            if len(frame)
            for t in (frame[first].min(), frame[last].max())
            if math.isfinite(float(t))
        ]
        return (min(times), max(times)) if times else None


def add_relative_time(run: Run) -> Run:
    """Set the column `t` of every frame with times, in place: seconds from the run's start (meta
    start_time, else its first record) to a sample's `time` or a step's or eval's `end` (always
    known, where a start may not be). Returns `run`."""
    t0 = run.meta.get("start_time")
    if not isinstance(t0, (int, float)) or not t0:
        span = run.recorded_span()
        t0 = span[0] if span else math.nan
    for frame, at in (
        (run.system, "time"),
        (run.processes, "time"),
        (run.steps, "end"),
        (run.evals, "end"),
        (run.headspace, "end"),
    ):
        frame[schema.RELATIVE_TIME] = frame[at].astype(float) - float(t0)
    return run


def frame(rows: list[tuple], columns: list[str]) -> pd.DataFrame:
    """Rows as a frame whose time and measure columns are float (None -> NaN)."""
    import pandas as pd

    ints = {"host", "rank", "local_rank", "pid", "step", "batches"}
    df = pd.DataFrame(rows, columns=columns)
    return df.astype({c: float for c in columns if c not in ints})
