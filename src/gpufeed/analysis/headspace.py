"""The job's own ceiling (`gpufeed profile --headspace N`): the steps fed one kept batch, kept apart
from the training steps, and the share of that ceiling the training steps reach.

A replayed step waits on no input, so its time is this model's and loop's step time without the
loader: the ceiling. The steps right after the window are left out of the steady state too: the
loader filled its queue while it was not asked, so they wait less than the run's own steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

# Batches a DataLoader holds ready per worker (its default prefetch_factor), and a few more: the
# steps after the window that its filled queue serves.
_READY_PER_WORKER, _READY_MORE = 2, 2


def windows(ranks: list[dict[str, Any]]) -> dict[tuple[str, int], tuple[int, int, int]]:
    """{(host, rank): (first replayed step, last replayed step, last refill step)} of the training
    processes that replayed steps (meta ``ranks``: ``headspace``, ``loader_workers``)."""
    out = {}
    for r in ranks:
        window = r.get("headspace")
        if not window:
            continue
        first, last = int(window[0]), int(window[1])
        workers = int(r.get("loader_workers") or 0)
        out[(str(r["host"]), int(r["rank"] or 0))] = (
            first,
            last,
            last + _READY_PER_WORKER * workers + _READY_MORE,
        )
    return out


def _mask(steps: pd.DataFrame, spans: dict[tuple[str, int], tuple[int, int]]) -> np.ndarray:
    """Rows of `steps` whose step lies in its rank's span (first, last), both included."""
    out = np.zeros(len(steps), dtype=bool)
    if not spans or not len(steps):
        return out
    hosts, ranks = steps["host"].astype(str).to_numpy(), steps["rank"].to_numpy()
    numbers = steps["step"].to_numpy()
    for (host, rank), (first, last) in spans.items():
        out |= (hosts == host) & (ranks == rank) & (numbers >= first) & (numbers <= last)
    return out


def split_replayed(
    steps: pd.DataFrame, ranks: list[dict[str, Any]]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(training steps, replayed steps) of a steps frame, by each rank's window."""
    spans = {key: (first, last) for key, (first, last, _) in windows(ranks).items()}
    replayed = _mask(steps, spans)
    return (
        steps[~replayed].reset_index(drop=True),
        steps[replayed].reset_index(drop=True),
    )


def refill_mask(steps: pd.DataFrame, ranks: list[dict[str, Any]]) -> np.ndarray:
    """Training steps right after a rank's window, served by the queue its loader filled meanwhile."""
    spans = {key: (last + 1, refill) for key, (_, last, refill) in windows(ranks).items()}
    return _mask(steps, spans)


@dataclass(frozen=True)
class Ceiling:
    """Median seconds of a replayed step (`ceiling_step`) and of a training step after warm-up and
    refill (`real_step`); `share` = ceiling_step / real_step, at most 1: how close the job runs to
    its own ceiling. `speedup` = 1 / share: what removing every wait on input can give."""

    replayed_steps: int
    ceiling_step: float
    real_step: float
    share: float

    @property
    def speedup(self) -> float:
        """Real step time over the ceiling's: the most that feeding the steps faster can give."""
        return 1.0 / self.share

    def evidence(self) -> dict[str, float | int]:
        """The figures as a finding's evidence states them."""
        return {
            "ceiling_share": round(self.share, 4),
            "ceiling_step_ms": round(1e3 * self.ceiling_step, 2),
            "real_step_ms": round(1e3 * self.real_step, 2),
            "replayed_steps": self.replayed_steps,
        }


def measure_ceiling(replayed: pd.DataFrame, steady: pd.DataFrame) -> Ceiling | None:
    """The ceiling from the replayed steps and the steady training steps (both per rank, pooled:
    a DDP job's ranks replay the same steps); None where either has no timed step."""
    ceiling = _median(replayed)
    real = _median(steady)
    if ceiling is None or real is None or real <= 0:
        return None
    return Ceiling(
        replayed_steps=int(replayed.groupby(["host", "rank"]).size().max()),
        ceiling_step=ceiling,
        real_step=real,
        share=min(1.0, ceiling / real),
    )


def _median(steps: pd.DataFrame) -> float | None:
    if not len(steps):
        return None
    d = steps["duration"].to_numpy(dtype=float)
    d = d[np.isfinite(d)]
    return float(np.median(d)) if len(d) else None
