"""Statistics of a run shared by the summary and the rules: phases, step throughput, metric percentiles."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from gpufeed.analyze.run import Run

PERCENTILES: tuple[tuple[str, float], ...] = (
    ("min", 0),
    ("p50", 50),
    ("p90", 90),
    ("p95", 95),
    ("p99", 99),
    ("max", 100),
)
# Display order of system metrics (the schema's order); unknown metrics follow, alphabetically.
METRIC_ORDER = (
    "cpu.util",
    "cpu.core",
    "cpu.iowait",
    "mem.used",
    "mem.total",
    "disk.read",
    "disk.write",
    "net.rx",
    "net.tx",
    "gpu.util",
    "gpu.mem_util",
    "gpu.mem_used",
    "gpu.mem_total",
    "gpu.power",
    "gpu.sm_clock",
    "gpu.pcie_rx",
    "gpu.pcie_tx",
)


def percentile_table(run: Run, by_host: bool = False) -> pd.DataFrame:
    """Per system metric and device (and host if `by_host`): n and min, p50, p90, p95, p99, max."""
    keys = ["host", "metric", "device"] if by_host else ["metric", "device"]
    cols = ["n"] + [name for name, _ in PERCENTILES]
    sysdf = run.system
    if len(sysdf) == 0:
        return pd.DataFrame(columns=cols, index=pd.MultiIndex.from_tuples([], names=keys))
    qs = [q for _, q in PERCENTILES]
    rows = {}
    for key, g in sysdf.groupby(keys, sort=False):
        v = g["value"].to_numpy(dtype=float)
        v = v[np.isfinite(v)]
        if v.size:
            rows[key] = [v.size, *np.percentile(v, qs)]
    table = pd.DataFrame.from_dict(rows, orient="index", columns=cols)
    table.index = pd.MultiIndex.from_tuples(table.index, names=keys)
    rank = {m: i for i, m in enumerate(METRIC_ORDER)}
    order = sorted(
        table.index,
        key=lambda k: tuple(
            (rank.get(part, len(rank)), part)
            if name == "metric"
            else (_device_key(part) if name == "device" else part)
            for name, part in zip(keys, k, strict=True)
        ),
    )
    table = table.loc[order]
    table["n"] = table["n"].astype(int)
    return table


def _device_key(device: str) -> tuple[int, str]:
    return (int(device), "") if device.isdigit() else (-1, device)


def run_span(run: Run) -> tuple[float, float]:
    """(start, end) of the run in epoch seconds: meta times, else what the stores saw."""
    meta = run.meta
    starts = [meta.get("start_time")] + [r.get("start") for r in meta.get("ranks", [])]
    ends = [meta.get("end_time")] + [r.get("end") for r in meta.get("ranks", [])]
    if len(run.system):
        starts.append(float(run.system["time"].min()))
        ends.append(float(run.system["time"].max()))
    if len(run.steps):
        ends.append(float(run.steps["end"].max()))
    start = meta.get("start_time") or _finite_min(starts)
    end = meta.get("end_time") or _finite_max(ends)
    return float(start), float(end)


def phases(run: Run) -> pd.DataFrame:
    """Rows (phase, start, end, duration) for initialization, training and finalization.

    Initialization runs from the start of the run to the first step's start (its end if the start is
    unknown); training to the last step's end on any rank; finalization to the end of the run.
    Without steps the whole run is one initialization phase.
    """
    start, end = run_span(run)
    steps = run.steps
    if len(steps) == 0:
        bounds = [("initialization", start, end)]
    else:
        first = steps["start"].where(np.isfinite(steps["start"]), steps["end"]).min()
        last = float(steps["end"].max())
        bounds = [
            ("initialization", start, float(first)),
            ("training", float(first), last),
            ("finalization", last, max(end, last)),
        ]
    df = pd.DataFrame(bounds, columns=["phase", "start", "end"])
    df["duration"] = df["end"] - df["start"]
    return df


def step_summary(run: Run) -> dict[str, Any]:
    """Steps, ranks, steps/s (per rank), samples/s (all ranks), step time p50/p95, data-wait share."""
    steps = run.steps
    timed = steps[np.isfinite(steps["duration"].to_numpy(dtype=float))]
    out: dict[str, Any] = {
        "steps": len(steps),
        "ranks": int(steps.groupby(["host", "rank"]).ngroups) if len(steps) else 0,
        "steps_per_s": math.nan,
        "samples_per_s": math.nan,
        "step_p50": math.nan,
        "step_p95": math.nan,
        "data_wait_share": math.nan,
        "training_time": math.nan,
    }
    if len(timed) == 0:
        return out
    rates, spans = [], []
    for _, g in timed.groupby(["host", "rank"]):
        span = float(g["end"].max() - g["start"].min())
        spans.append(span)
        if span > 0:
            rates.append(len(g) / span)
    span = float(timed["end"].max() - timed["start"].min())
    samples = timed["samples"].to_numpy(dtype=float)
    durations = timed["duration"].to_numpy(dtype=float)
    out.update(
        steps_per_s=float(np.mean(rates)) if rates else math.nan,
        samples_per_s=float(np.nansum(samples) / span)
        if span > 0 and np.isfinite(samples).any()
        else math.nan,
        step_p50=float(np.percentile(durations, 50)),
        step_p95=float(np.percentile(durations, 95)),
        data_wait_share=float(timed["data_wait"].sum() / durations.sum())
        if durations.sum() > 0
        else math.nan,
        training_time=span,
    )
    return out


def _finite_min(values: list[Any]) -> float:
    v = [float(x) for x in values if x is not None and math.isfinite(float(x))]
    return min(v) if v else math.nan


def _finite_max(values: list[Any]) -> float:
    v = [float(x) for x in values if x is not None and math.isfinite(float(x))]
    return max(v) if v else math.nan
