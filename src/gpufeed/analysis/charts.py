"""`ChartData`: the figures behind the HTML report's charts, computed once (`chart_data`, called by
`analyze_run`): per-time series binned to at most `points` bins (CPU cores and GPUs, utilization,
CPU by process role, memory), and per-step series of the lowest rank (step time, phases) as means
of consecutive steps past `points`, the step-time histogram and each rank's mean step.
`present.html_charts` only turns them into plotly figures."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gpufeed.analysis.schema import UNITS
from gpufeed.analysis.stats import (
    PHASES,
    binned_mean,
    device_key,
    role_totals,
    step_phases,
    time_bins,
)

if TYPE_CHECKING:
    import pandas as pd

    from gpufeed.analysis.frames import Run
    from gpufeed.analysis.timeline import Timeline

# Bins (and per-step points) per series of the report's charts: plotly.js stays the report's only
# large part, also for a 24-hour run.
CHART_POINTS = 1200


@dataclass(frozen=True)
class HeatRow:
    """One row of a heatmap: a device of a host, its mean per time bin."""

    host: Any
    device: Any
    values: np.ndarray


@dataclass(frozen=True)
class StepLine:
    """The lowest rank's step time, step by step (a mean of every `per` consecutive steps)."""

    label: str
    """Which rank: "rank 0", "rank 0 on HOST" where the run has several hosts."""
    per: int
    x: np.ndarray
    """Each point's (mean) step end, in seconds from the run's start."""
    ms: np.ndarray


@dataclass(frozen=True)
class Breakdown:
    """The lowest rank's steps split into their parts, per point (a mean of every `per` steps)."""

    label: str
    per: int
    steps: int
    split: bool
    """Whether the model's phases were measured (else: data wait vs the rest)."""
    clock: str
    """"cuda" where CUDA events timed the model's phases, else "host" (`stats.step_phases`)."""
    x: np.ndarray
    """The step number of each point."""
    parts: dict[str, np.ndarray]
    """Each part's milliseconds per point, in stacking order: "data_wait_cpu" (the wait the
    training thread spent on a CPU or ready for one, where measured), "data_wait", the model's
    phases (where `split`) and "other"."""
    unknown: int
    """Steps whose data wait was not measured (their wait is inside "other")."""


@dataclass(frozen=True)
class Histogram:
    """The step-time histogram: 60 bins; past 200 steps the longest 0.5% go into the last."""

    centers: np.ndarray
    """Each bin's middle, ms."""
    counts: np.ndarray
    clipped: bool


@dataclass(frozen=True)
class RankBars:
    """Each rank's mean step: its data wait and the rest (an unknown wait counts as the rest)."""

    ranks: list[tuple[Any, Any]]
    """(host, rank) of each bar, in order."""
    several_hosts: bool
    wait_ms: np.ndarray
    compute_ms: np.ndarray


@dataclass(frozen=True)
class MemoryLine:
    """Memory used by one host ("host") or GPU ("GPU") over time, GiB per time bin."""

    what: str
    host: Any
    device: Any
    several_hosts: bool
    values: np.ndarray


@dataclass(frozen=True)
class ChartData:
    """Everything the report's charts draw; empty lists and None where the run lacks the data."""

    points: int
    """The most bins or points per series."""
    x: np.ndarray
    """The middle of each time bin, in seconds from the run's start."""
    cores: list[HeatRow]
    """Each CPU core's % busy (`cpu.core`), hosts and cores in order."""
    gpus: list[HeatRow]
    """Each GPU's % busy (`gpu.util`)."""
    util: np.ndarray
    """The mean of the GPUs' % busy per bin where the run has GPU data, else the host CPU's."""
    step_line: StepLine | None
    eval_bands: list[tuple[float, float]]
    """The lowest rank's evaluation passes (at most `points`), in seconds from the run's start."""
    breakdown: Breakdown | None
    histogram: Histogram | None
    roles: dict[str, np.ndarray]
    """Cores busy per process role (summed over processes and hosts; 0 where a sampled host had
    none of the role), per bin."""
    ranks: RankBars | None
    """Where the run has several ranks."""
    memory: list[MemoryLine]


def chart_data(run: Run, timeline: Timeline, points: int = CHART_POINTS) -> ChartData:
    """The report's chart figures of `run` (its `timeline` made by `analysis.timeline`)."""
    t0, t1 = timeline.span
    if not math.isfinite(t0):
        t0, t1 = 0.0, 0.0
    edges = time_bins(run, t0, t1, points)
    gpus = _heat_rows(run, "gpu.util", edges)
    util = run.system[run.system["metric"] == ("gpu.util" if gpus else "cpu.util")]
    steps = timeline.steps
    several = len(steps) > 0 and steps.groupby(["host", "rank"]).ngroups > 1
    return ChartData(
        points=points,
        x=(edges[:-1] + edges[1:]) / 2 - t0,
        cores=_heat_rows(run, "cpu.core", edges),
        gpus=gpus,
        util=binned_mean(util["time"], util["value"], edges),
        step_line=_step_line(steps, t0, points) if len(steps) else None,
        eval_bands=_eval_bands(timeline.evals, t0, points),
        breakdown=_breakdown(steps, points) if len(steps) else None,
        histogram=_histogram(steps) if len(steps) else None,
        roles=_roles(run, edges),
        ranks=_ranks(steps) if several else None,
        memory=_memory(run, edges),
    )


def _heat_rows(run: Run, metric: str, edges: np.ndarray) -> list[HeatRow]:
    rows = run.system[run.system["metric"] == metric]
    if len(rows) == 0:
        return []
    groups = sorted(
        rows.groupby(["host", "device"]), key=lambda kv: (kv[0][0], device_key(kv[0][1]))
    )
    return [
        HeatRow(host, device, binned_mean(g["time"], g["value"], edges))
        for (host, device), g in groups
    ]


def lowest_rank(steps: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The steps of the lowest rank (rank 0) on its own host, in step order, and a label for it."""
    lowest = steps["rank"] == steps["rank"].min()
    hosts = steps["host"].astype(str)
    host = hosts[lowest].min()
    rank = steps[lowest & (hosts == host)].sort_values("step")
    label = f"rank {int(rank['rank'].iloc[0])}"
    return rank, label + (f" on {host}" if hosts.nunique() > 1 else "")


def _chunks(n: int, points: int) -> tuple[int, np.ndarray, np.ndarray]:
    """(steps per point, each step's point, steps in each point) for `n` steps."""
    per = max(1, math.ceil(n / points))
    idx = np.arange(n) // per
    return per, idx, np.bincount(idx)


def _step_line(steps: pd.DataFrame, t0: float, points: int) -> StepLine:
    rank, label = lowest_rank(steps)
    per, idx, count = _chunks(len(rank), points)
    end = np.bincount(idx, rank["end"].to_numpy(dtype=float)) / count
    ms = np.bincount(idx, 1e3 * rank["duration"].to_numpy(dtype=float)) / count
    return StepLine(label=label, per=per, x=end - t0, ms=ms)


def _eval_bands(evals: pd.DataFrame, t0: float, points: int) -> list[tuple[float, float]]:
    if len(evals) == 0:
        return []
    lowest, _ = lowest_rank(evals.assign(step=evals["start"]))
    return [(a - t0, b - t0) for a, b in lowest[["start", "end"]].to_numpy(dtype=float)[:points]]


def _breakdown(steps: pd.DataFrame, points: int) -> Breakdown:
    """Per point of the lowest rank: data wait, forward, backward, optimizer, other where the hooks
    measured them (GPU time where CUDA events did), else data wait vs the rest; an unmeasured data
    wait is never counted as zero, it stays inside "other". Where the training thread's CPU during
    the wait was measured, the wait is two parts: busy (on a CPU or ready for one: loading or
    unpickling batches itself) and the rest (asleep on workers or storage)."""
    rank, label = lowest_rank(steps)
    phases, clock = step_phases(rank)
    n = len(rank)
    per, idx, count = _chunks(n, points)
    dur = rank["duration"].to_numpy(dtype=float)
    wait = rank["data_wait"].to_numpy(dtype=float)
    split = bool(np.isfinite(phases["forward"].to_numpy(float)).any())
    parts: dict[str, np.ndarray] = {}
    if split:
        for p in PHASES[1:-1]:
            parts[p] = np.nan_to_num(phases[p].to_numpy(dtype=float))
    known_wait = np.nan_to_num(wait)
    waits = {"data_wait": known_wait}
    cpu = rank["data_wait_cpu"].to_numpy(dtype=float) if "data_wait_cpu" in rank else wait * np.nan
    if (np.isfinite(cpu) & np.isfinite(wait)).any():
        ready = rank["data_wait_ready"].to_numpy(dtype=float) if "data_wait_ready" in rank else 0
        busy = np.minimum(np.nan_to_num(cpu) + np.nan_to_num(ready), known_wait)
        waits = {"data_wait_cpu": busy, "data_wait": known_wait - busy}
    parts = {**waits, **parts}
    parts["other"] = np.maximum(dur - sum(parts.values()), 0.0)
    return Breakdown(
        label=label,
        per=per,
        steps=n,
        split=split,
        clock=clock,
        x=rank["step"].to_numpy()[::per],
        parts={p: 1e3 * np.bincount(idx, v) / count for p, v in parts.items()},
        unknown=int(np.isnan(wait).sum()),
    )


def _histogram(steps: pd.DataFrame) -> Histogram:
    ms = 1e3 * steps["duration"].to_numpy(dtype=float)
    hi = float(np.percentile(ms, 99.5)) if len(ms) > 200 else float(ms.max())
    counts, edges = np.histogram(np.minimum(ms, hi), bins=60, range=(0.0, max(hi, 1e-3)))
    return Histogram(centers=(edges[:-1] + edges[1:]) / 2, counts=counts, clipped=len(ms) > 200)


def _roles(run: Run, edges: np.ndarray) -> dict[str, np.ndarray]:
    cores = role_totals(run, edges, "cpu", absent=0.0) / 100.0
    return {role: cores[role].to_numpy(dtype=float) for role in cores.columns}


def _ranks(steps: pd.DataFrame) -> RankBars:
    g = steps.groupby(["host", "rank"])
    wait = 1e3 * g["data_wait"].mean().fillna(0.0).to_numpy()  # unknown waits stay in compute
    step = 1e3 * g["duration"].mean().to_numpy()
    return RankBars(
        ranks=list(g.groups),
        several_hosts=steps["host"].nunique() > 1,
        wait_ms=wait,
        compute_ms=step - wait,
    )


def _memory(run: Run, edges: np.ndarray) -> list[MemoryLine]:
    lines = []
    for metric, what in (("mem.used", "host"), ("gpu.mem_used", "GPU")):
        rows = run.system[run.system["metric"] == metric]
        several = rows["host"].nunique() > 1
        for (host, device), g in rows.groupby(["host", "device"]):
            values = binned_mean(g["time"], g["value"] / UNITS["bytes"].divisor, edges)
            lines.append(MemoryLine(what, host, device, several, values))
    return lines
