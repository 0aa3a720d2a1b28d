"""`Timeline`: what the time-based views of a run render (the HTML report's charts, the Perfetto
trace): the run's span, its timed training steps and its evaluation passes. Made by one call,
`timeline(run)`, without the rules, so that `gpufeed trace` renders a run without analyzing it
and no presenter computes these itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from gpufeed.analysis.stats import evaluation_passes, run_span

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
