"""Facts about a run's steps: the steady state after warm-up, its time window, the replayed spans
left out, and the data wait's share and cost."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from gpufeed.analysis.headspace import refill_mask
from gpufeed.analysis.rules.periods import stall_period, waits_for_data

STEP_COLUMNS = ["host", "rank", "step", "start", "end", "duration", "data_wait"]


def finite_steps(steps: pd.DataFrame | None) -> pd.DataFrame:
    """Every recorded step with a duration, sorted by rank then step."""
    if steps is None or len(steps) == 0:
        return pd.DataFrame(columns=STEP_COLUMNS)
    steps = steps[np.isfinite(steps["duration"].to_numpy(dtype=float))]
    return steps.sort_values(["rank", "step"], kind="stable").reset_index(drop=True)


def steady_steps(
    all_steps: pd.DataFrame, ranks: list[Any], warmup_steps: int, warmup_seconds: float
) -> pd.DataFrame:
    """Post-warm-up steps of every rank (``data_wait`` NaN read as 0): per rank the first
    `warmup_steps` and those within `warmup_seconds` of its first step are left out, never more
    than half of them, and the refill after a replay (`ranks`: meta's)."""
    parts = []
    for _, g in all_steps.groupby("rank", sort=True):
        first = g["start"].iloc[0]
        warm = (np.arange(len(g)) < warmup_steps) | (g["start"].to_numpy() < first + warmup_seconds)
        skip = min(int(warm.sum()), len(g) // 2)
        parts.append(g.iloc[skip:])
    if not parts:
        return all_steps.iloc[0:0]
    out = pd.concat(parts, ignore_index=True)
    out = out[~refill_mask(out, ranks)].reset_index(drop=True)
    out["data_wait"] = out["data_wait"].fillna(0.0).clip(lower=0.0)
    out["data_wait"] = np.minimum(out["data_wait"], out["duration"])
    return out


def replay_spans(
    all_steps: pd.DataFrame, headspace: pd.DataFrame, ranks: list[Any]
) -> list[tuple[float, float]]:
    """(start, end) epoch seconds of each rank's replayed steps and the refill after them:
    system and process samples there show an idle loader, not the run's own."""
    spans = []
    refill = refill_mask(all_steps, ranks)
    for key, g in headspace.groupby(["host", "rank"]):
        mine = (all_steps["host"] == key[0]) & (all_steps["rank"] == key[1]) & refill
        end = max(
            float(g["end"].max()), float(all_steps.loc[mine, "end"].max()) if mine.any() else 0
        )
        spans.append((float(g["start"].min()), end))
    return spans


def outside_replay(frame: pd.DataFrame, spans: list[tuple[float, float]]) -> pd.DataFrame:
    """The rows of `frame` whose `time` lies in none of `spans`."""
    for t0, t1 in spans:
        frame = frame[(frame["time"] < t0) | (frame["time"] > t1)]
    return frame


def in_window(
    frame: pd.DataFrame, window: tuple[float, float], spans: list[tuple[float, float]]
) -> pd.DataFrame:
    """The rows of `frame` timed inside `window` and outside the replayed `spans`."""
    t0, t1 = window
    return outside_replay(frame[(frame["time"] >= t0) & (frame["time"] <= t1)], spans)


def steady_window(
    steps: pd.DataFrame, system: pd.DataFrame, meta: dict[str, Any], warmup_seconds: float
) -> tuple[float, float]:
    """(start, end) of the steady state in epoch seconds: that of the post-warm-up `steps`, else
    the run's (meta, else the system samples') less the warm-up seconds."""
    if len(steps):
        return float(steps["start"].min()), float(steps["end"].max())
    t = system["time"] if len(system) else pd.Series([0.0])
    start = meta.get("start_time") or float(t.min())
    end = meta.get("end_time") or float(t.max())
    return float(start) + warmup_seconds, float(end)


def steady_wait(
    all_steps: pd.DataFrame, steps: pd.DataFrame, ranks: list[Any]
) -> tuple[int, float] | None:
    """(warm-up steps left out, at most of any rank; the data wait's share of the steps judged
    after them), or None where no step is judged."""
    if not len(steps):
        return None
    kept = all_steps[~refill_mask(all_steps, ranks)]  # refill: not warm-up
    left = kept.groupby("rank").size() - steps.groupby("rank").size()
    return int(left.max()), wait_share(steps)


def most_waiting_rank(steps: pd.DataFrame) -> pd.DataFrame:
    """The steps of the rank whose steps wait the largest share of their time for data."""
    shares = {r: wait_share(g) for r, g in steps.groupby("rank")}
    rank = max(shares, key=shares.__getitem__)
    return steps[steps["rank"] == rank]


def data_stall_period(steps: pd.DataFrame, p: dict[str, Any]) -> tuple[int, int] | None:
    """(N, r) when every N-th step of one rank is slow because it waits for data (most of the slow
    steps' excess over the other steps' median is data wait, as when N loader workers each deliver
    one batch in turn); None otherwise. `p`: PeriodicStall's parameters (`shared.STALL_PERIOD`, `periods.find_period`)."""
    found = stall_period(steps, p)
    if found is None or not waits_for_data(found, steps):
        return None
    return found.n, found.r


def wait_share(steps: pd.DataFrame) -> float:
    """Data wait as a share of step time: sum(wait) / sum(duration), where duration includes the wait."""
    total = float(steps["duration"].sum())
    return float(steps["data_wait"].sum()) / total if total > 0 else 0.0


def speedup_without(steps: pd.DataFrame, lost: pd.Series | float) -> float:
    """Expected speedup if `lost` seconds (per step, or in all) vanished: mean step / mean (step - lost)."""
    total = float(steps["duration"].sum())
    lost_total = float(np.sum(lost))
    remaining = total - lost_total
    if total <= 0 or remaining <= 0:
        return 1.0
    return max(1.0, total / remaining)


def pct(values: Any, q: float) -> float:
    """Percentile q (0-100) of finite values, NaN if there are none."""
    a = np.asarray(values, dtype=float)
    a = a[np.isfinite(a)]
    return float(np.percentile(a, q)) if a.size else float("nan")
