"""Statistics of a run shared by the summary and the rules: phases, step throughput, metric percentiles."""

from __future__ import annotations

import math
import signal
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from gpufeed.analysis.run import Run

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
            else (device_key(part) if name == "device" else part)
            for name, part in zip(keys, k, strict=True)
        ),
    )
    table = table.loc[order]
    table["n"] = table["n"].astype(int)
    return table


def device_key(device: str) -> tuple[int, str]:
    """Sort key for device ids: GPUs by number ("2" before "10"), named devices first."""
    return (int(device), "") if str(device).isdigit() else (-1, str(device))


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


def time_bins(run: Run, t0: float, t1: float, most: int) -> np.ndarray:
    """Edges of the time bins of a per-time view from `t0` to `t1`: one bin per sample of the
    most-sampled host, at most `most`, and each at least 1.5 sampling intervals wide, so that a
    sample a little late (the sampler jitters) or hosts sampling at different moments leave no bin
    empty."""
    system = run.system
    n = int(system.groupby("host")["time"].nunique().max()) if len(system) else most
    interval = run.meta.get("interval")  # of several hosts' runs, the longest (combine)
    if isinstance(interval, (int, float)) and interval > 0 and t1 > t0:
        n = min(n, int((t1 - t0) / (1.5 * interval)))
    return np.linspace(t0, t1, max(2, min(most, n)) + 1)


def bin_index(times: Any, edges: np.ndarray) -> np.ndarray:
    """The bin of `edges` each time falls in (times outside go to the first or last bin)."""
    t = np.asarray(times, dtype=float)
    return np.clip(np.searchsorted(edges, t, side="right") - 1, 0, len(edges) - 2)


def binned_mean(times: Any, values: Any, edges: np.ndarray) -> np.ndarray:
    """Mean of `values` in each time bin of `edges` (NaN where a bin is empty); pairs where the
    time or the value is not finite are left out."""
    t = np.asarray(times, dtype=float)
    v = np.asarray(values, dtype=float)
    ok = np.isfinite(t) & np.isfinite(v)
    t, v = t[ok], v[ok]
    bins = len(edges) - 1
    idx = bin_index(t, edges)
    count = np.bincount(idx, minlength=bins)
    total = np.bincount(idx, v, minlength=bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def role_totals(
    run: Run, edges: np.ndarray, column: str, how: str = "mean", absent: float | None = None
) -> pd.DataFrame:
    """Per time bin (rows) and process role (columns): `column` ("cpu", % of one core, or "rss",
    bytes) summed over a role's processes and over hosts; NaN where no host had a process of the
    role, or `absent` (e.g. 0 for a chart) where a host was sampled without one. Each host's
    samples within a bin are combined first (`how`: "mean" or "max"), so hosts that sample at
    different moments still add up."""
    p = run.processes
    bins = range(len(edges) - 1)
    if len(p) == 0:
        return pd.DataFrame(index=bins)
    per = p.groupby(["host", "time", "role"])[column].sum().unstack("role", fill_value=absent)
    index = bin_index(per.index.get_level_values("time"), edges)
    per_host = per.groupby([per.index.get_level_values("host"), index]).agg(how)
    return per_host.groupby(level=1).sum(min_count=1).reindex(bins)


def phases(run: Run) -> pd.DataFrame:
    """Rows (phase, start, end, duration) for initialization, training, evaluation, finalization.

    Initialization runs from the start of the run to the first step's start (its end if the start is
    unknown); training to the last step's end on any rank; finalization to the end of the run.
    Evaluation passes (``run.evals``) are taken out of the phase they fall in and summed in their
    own row (present only when there were any). Without steps the whole run is initialization.
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
    evals = evaluation_passes(run)
    if len(evals):
        mid = ((evals["start"] + evals["end"]) / 2).to_numpy(dtype=float)
        for i, row in df.iterrows():
            inside = (mid >= row["start"]) & (mid < row["end"])
            df.loc[i, "duration"] -= float(evals["duration"].to_numpy(dtype=float)[inside].sum())
        df["duration"] = df["duration"].clip(lower=0.0)
        row = ("evaluation", float(evals["start"].min()), float(evals["end"].max()))
        total = float(evals.groupby(["host", "rank"])["duration"].sum().mean())
        ev = pd.DataFrame([(*row, total)], columns=["phase", "start", "end", "duration"])
        df = pd.concat([df.iloc[:2], ev, df.iloc[2:]], ignore_index=True)
    return df


def evaluation_passes(run: Run) -> pd.DataFrame:
    """The run's evaluation passes with a known duration (``run.evals`` rows; empty if none)."""
    evals = getattr(run, "evals", None)
    if evals is None or len(evals) == 0:
        return pd.DataFrame(columns=["host", "rank", "start", "end", "duration", "samples"])
    return evals[np.isfinite(evals["duration"].to_numpy(dtype=float))]


def step_summary(run: Run) -> dict[str, Any]:
    """Training steps only: steps, ranks, steps/s (per rank), samples/s (all ranks), step time p50/p95,
    data-wait share (NaN = unknown: no step had a measured wait), ``data_wait_cpu_share`` and
    ``data_wait_ready_share`` (the shares of that wait the training thread spent on a CPU, and
    ready for one on a busy host; NaN where not measured), phase shares (``phase_clock``
    says which clock timed forward, backward and optimizer: `step_phases`); evaluation apart.

    Rates divide by the time spent in training steps (evaluation passes are not steps, so they do
    not dilute throughput); ``eval_time`` and ``eval_passes`` say how long evaluation took per rank.
    """
    steps = run.steps
    timed = steps[np.isfinite(steps["duration"].to_numpy(dtype=float))]
    evals = evaluation_passes(run)
    out: dict[str, Any] = {
        "steps": len(steps),
        "ranks": int(steps.groupby(["host", "rank"]).ngroups) if len(steps) else 0,
        "steps_per_s": math.nan,
        "samples_per_s": math.nan,
        "step_p50": math.nan,
        "step_p95": math.nan,
        "data_wait_share": math.nan,
        "data_wait_cpu_share": math.nan,
        "data_wait_ready_share": math.nan,
        "training_time": math.nan,
        "eval_time": float(evals.groupby(["host", "rank"])["duration"].sum().mean())
        if len(evals)
        else 0.0,
        "eval_passes": int(evals.groupby(["host", "rank"]).size().max()) if len(evals) else 0,
        **{f"{p}_share": math.nan for p in PHASES},
        "phase_clock": "host",
    }
    if len(timed) == 0:
        return out
    busy = timed.groupby(["host", "rank"])["duration"].sum()
    counts = timed.groupby(["host", "rank"]).size()
    rates = [counts[k] / busy[k] for k in busy.index if busy[k] > 0]
    train_time = float(busy.mean())
    samples = timed["samples"].to_numpy(dtype=float)
    durations = timed["duration"].to_numpy(dtype=float)
    out.update(
        steps_per_s=float(np.mean(rates)) if rates else math.nan,
        samples_per_s=float(np.nansum(samples) / train_time)
        if train_time > 0 and np.isfinite(samples).any()
        else math.nan,
        step_p50=float(np.percentile(durations, 50)),
        step_p95=float(np.percentile(durations, 95)),
        data_wait_share=_share(timed["duration"], timed["data_wait"]),
        training_time=train_time,
    )
    for part in ("cpu", "ready"):
        if f"data_wait_{part}" in timed:
            out[f"data_wait_{part}_share"] = _share(timed["data_wait"], timed[f"data_wait_{part}"])
    parts, out["phase_clock"] = step_phases(timed)
    for p in PHASES:
        out[f"{p}_share"] = _share(timed["duration"], parts[p])
    return out


# Parts of a training step, in the order they happen.
PHASES = ("data_wait", "forward", "backward", "optimizer", "other")
# Where the GPU clock timed a phase (CUDA events, `analysis.run`), its column.
GPU_PHASE_COLUMNS = {
    "forward": "gpu_forward",
    "backward": "gpu_backward",
    "optimizer": "gpu_optimizer",
}


def step_phases(steps: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """Each step's PHASES (seconds, NaN where not measured) and the clock of its model phases:
    "cuda" where CUDA events timed the model's GPU work (the host clock would only time kernel
    launches), else "host". On the GPU clock "other" is what the step's wall time leaves (never
    below zero: GPU work may overlap the next batch's wait)."""
    parts = steps.reindex(columns=list(PHASES)).astype(float)
    gpu = all(c in steps for c in GPU_PHASE_COLUMNS.values()) and bool(
        np.isfinite(steps["gpu_forward"].to_numpy(dtype=float)).any()
    )
    if not gpu:
        return parts, "host"
    for phase, column in GPU_PHASE_COLUMNS.items():
        parts[phase] = steps[column].astype(float)
    known = parts[["data_wait", "forward", "backward", "optimizer"]].fillna(0.0).sum(axis=1)
    other = (steps["duration"].astype(float) - known).clip(lower=0.0)
    parts["other"] = other.where(parts["forward"].notna())
    return parts, "cuda"


def _share(durations: pd.Series, values: pd.Series) -> float:
    """Share of `durations` (step time) in `values`, over the steps where it was measured; NaN
    where none was."""
    known = np.isfinite(values.to_numpy(dtype=float))
    total = float(durations[known].sum())
    return float(values[known].clip(lower=0.0).sum() / total) if total > 0 else math.nan


def _finite_min(values: list[Any]) -> float:
    v = [float(x) for x in values if x is not None and math.isfinite(float(x))]
    return min(v) if v else math.nan


def _finite_max(values: list[Any]) -> float:
    v = [float(x) for x in values if x is not None and math.isfinite(float(x))]
    return max(v) if v else math.nan


# Shares of its data wait a training thread spends working (on a CPU, or ready for one), at or
# below which it is asleep (on workers, storage or latency) and at or above which it loads or
# unpacks the batches itself.
WAIT_ASLEEP, WAIT_LOADING = 0.3, 0.7


def no_steps_note(run: Run) -> str:
    """Why a run holds no training steps, from what it does hold."""
    code = run.meta.get("exit_code")
    killed = (
        "it was killed before its first steps were written"
        if isinstance(code, int) and (code < 0 or 128 < code < 128 + signal.NSIG)
        else ""
    )
    if not run.meta.get("ranks"):
        return killed or (
            "no process recorded any: none trained with a torch optimizer or called "
            "gpufeed.step(), or the profiler's hook was not loaded in it (a script that replaces "
            "PYTHONPATH, python -I, -E or -S)"
        )
    return killed or (
        "its training processes did no optimizer step and called no gpufeed.step(), or ended "
        "before their first steps were written (killed with SIGKILL, or a multiprocessing Pool "
        "terminated)"
    )


def wait_cpu_note(summary: dict[str, Any]) -> str | None:
    """What the training thread did while its steps waited for data, from `step_summary`: one
    clause (working: loading batches itself, or unpacking those its workers send; on a busy host
    partly waiting for a free core), or None where the wait was not measured or too short to
    matter (under 5% of step time, where it is mostly the hand-over of ready batches)."""
    share, cpu = summary["data_wait_share"], summary["data_wait_cpu_share"]
    if not (math.isfinite(share) and math.isfinite(cpu)) or share < 0.05:
        return None
    ready = summary["data_wait_ready_share"]
    ready = ready if math.isfinite(ready) else 0.0
    busy = cpu + ready
    if busy >= WAIT_LOADING:
        what = "it loads or unpacks the batches itself"
    elif busy <= WAIT_ASLEEP:
        what = "asleep on loader workers or storage"
    else:
        what = "partly working on the batches, partly asleep"
    queued = f" and waiting for a free core {100 * ready:.0f}%" if ready >= 0.05 else ""
    return f"the training thread was on a CPU {100 * cpu:.0f}% of it{queued} ({what})"
