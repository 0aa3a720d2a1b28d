"""The HTML report's charts: plotly figures of the run (CPU cores and GPUs over time, utilization
with step time, per-step phases, the step time histogram, CPU by process role, ranks, memory), each
binned to at most `max_points` per series, with the template's placeholders and notes."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from gpufeed.analysis.schema import UNITS
from gpufeed.analysis.stats import (
    PHASES,
    device_key,
    evaluation_passes,
    role_totals,
    step_phases,
    time_bins,
)
from gpufeed.present import html_figures as plot

if TYPE_CHECKING:
    import pandas as pd

    from gpufeed.analysis.run import Run

# What NVML's utilization.gpu measures, said wherever the report shows it.
GPU_UTIL_MEANS = "% of time a kernel was running (NVML utilization.gpu; not SM occupancy)"
_PHASE_COLORS = {
    "data_wait_cpu": "#b45309",
    "data_wait": "#f59e0b",
    "forward": "#2563eb",
    "backward": "#7c3aed",
    "optimizer": "#059669",
    "other": "#94a3b8",
}
# The stacked bar of the data wait that the training thread spent working (loading, unpickling):
# on a CPU, or ready for one on a busy host.
_WAIT_CPU_BAR = "data wait, training thread busy"
_EVAL_COLOR = "rgba(236, 72, 153, 0.18)"
_ROLE_COLORS = {"main": "#2563eb", "worker": "#f59e0b", "other": "#94a3b8"}


def charts(
    run: Run, t0: float, t1: float, max_points: int
) -> tuple[list[dict[str, Any]], dict[str, Any], list[str]]:
    """(chart placeholders for the template, plotly figures by element id, notes on absent charts)."""
    figs: dict[str, Any] = {}
    notes: dict[str, str] = {}
    missing: list[str] = []
    edges = time_bins(run, t0, t1, max_points)

    cores = _heatmap(run, "cpu.core", edges, t0, "core")
    if cores:
        figs["chart-cpu-cores"] = plot.rows_fig(cores, "CPU cores over time (% busy)")
    gpus = _heatmap(run, "gpu.util", edges, t0, "GPU")
    if gpus:
        figs["chart-gpus"] = plot.rows_fig(gpus, "GPUs over time: busy, " + GPU_UTIL_MEANS)
    else:
        missing.append(
            f"No GPU heatmap: {run.meta.get('gpu_unavailable') or 'NVML reported no GPUs'}."
        )

    steps = run.steps[np.isfinite(run.steps["duration"].to_numpy(dtype=float))]
    figs["chart-util-steps"], notes["chart-util-steps"] = _util_vs_steps(
        run, steps, edges, t0, bool(gpus), max_points
    )
    if len(steps):
        figs["chart-step-breakdown"], notes["chart-step-breakdown"] = _breakdown(steps, max_points)
        figs["chart-step-hist"] = _histogram(steps)
    else:
        missing.append("No per-step charts: the run recorded no steps.")
    roles = _roles(run, edges, t0)
    if roles:
        figs["chart-roles"] = roles
    if len(steps) and steps.groupby(["host", "rank"]).ngroups > 1:
        figs["chart-ranks"] = _ranks(steps)
    memory = _memory(run, edges, t0)
    if memory:
        figs["chart-memory"] = memory

    pairs = {"chart-step-hist", "chart-roles", "chart-ranks", "chart-memory"}
    order = [k for k in figs if k not in pairs] + [k for k in figs if k in pairs]
    charts = [
        {"id": k, "note": notes.get(k, ""), "pair_start": False, "pair_end": False} for k in order
    ]
    paired = [c for c in charts if c["id"] in pairs]
    for i in range(0, len(paired) - 1, 2):
        paired[i]["pair_start"], paired[i + 1]["pair_end"] = True, True
    return charts, figs, missing


def _heatmap(
    run: Run, metric: str, edges: np.ndarray, t0: float, what: str
) -> list[dict[str, Any]]:
    rows = run.system[run.system["metric"] == metric]
    if len(rows) == 0:
        return []
    multi = rows["host"].nunique() > 1
    z, labels = [], []
    groups = sorted(
        rows.groupby(["host", "device"]), key=lambda kv: (kv[0][0], device_key(kv[0][1]))
    )
    for (host, device), g in groups:
        z.append(plot.clean(plot.binned(g["time"], g["value"], edges)))
        labels.append(plot.label(f"{host}:{what} {device}" if multi else f"{what} {device}"))
    return [
        {
            "type": "heatmap",
            "x": plot.clean(plot.centers(edges) - t0),
            "y": labels,
            "z": z,
            "zmin": 0,
            "zmax": 100,
            "colorscale": "Viridis",
            "colorbar": {"title": {"text": "%"}},
        }
    ]


def _util_vs_steps(
    run: Run, steps: pd.DataFrame, edges: np.ndarray, t0: float, has_gpu: bool, max_points: int
) -> tuple[dict[str, Any], str]:
    """Utilization (binned) with the step time of the lowest rank over it, step by step (a mean of
    consecutive steps past `max_points`), drawn as one connected line on top."""
    metric, name = (
        ("gpu.util", "GPU busy (mean of GPUs)") if has_gpu else ("cpu.util", "host CPU utilization")
    )
    rows = run.system[run.system["metric"] == metric]
    traces = [
        {
            "type": "scatter",
            "mode": "lines",
            "name": f"{name}, %",
            "x": plot.clean(plot.centers(edges) - t0),
            "y": plot.clean(plot.binned(rows["time"], rows["value"], edges)),
            "line": {"color": "#86efac", "width": 1},
            "fill": "tozeroy",
            "fillcolor": "rgba(134, 239, 172, 0.35)",
        }
    ]
    note = GPU_UTIL_MEANS if has_gpu else ""
    if len(steps):
        rank, label = _lowest_rank(steps)
        per = max(1, math.ceil(len(rank) / max_points))
        idx = np.arange(len(rank)) // per
        count = np.bincount(idx)
        end = np.bincount(idx, rank["end"].to_numpy(dtype=float)) / count
        ms = np.bincount(idx, 1e3 * rank["duration"].to_numpy(dtype=float)) / count
        traces.append(
            {
                "type": "scatter",
                "mode": "lines+markers" if len(ms) <= 200 else "lines",
                "name": "step time, ms" + (f" (mean of every {per} steps)" if per > 1 else ""),
                "x": plot.clean(end - t0),
                "y": plot.clean(ms),
                "yaxis": "y2",
                "line": {"color": "#1d4ed8", "width": 2.5},
                "marker": {"size": 4},
                "connectgaps": True,
            }
        )
        note = "; ".join(filter(None, [f"step time of {label}", note]))
    title = ("GPU" if has_gpu else "CPU (no GPU data)") + " utilization and step time"
    fig = plot.fig(traces, title, "seconds", "%")
    bands = _eval_bands(run, t0, max_points)
    if bands:
        fig["layout"]["shapes"] = bands
        note = "; ".join(filter(None, [note, "shaded: evaluation passes (not training steps)"]))
    fig["layout"]["yaxis"]["range"] = [0, 105]
    fig["layout"]["yaxis2"] = {
        "title": {"text": "step time, ms"},
        "overlaying": "y",
        "side": "right",
        "rangemode": "tozero",
        "showgrid": False,
    }
    return fig, note


def _eval_bands(run: Run, t0: float, max_points: int) -> list[dict[str, Any]]:
    """Shaded x-ranges for the lowest rank's evaluation passes (at most `max_points`)."""
    evals = evaluation_passes(run)
    if len(evals) == 0:
        return []
    lowest, _ = _lowest_rank(evals.assign(step=evals["start"]))
    return [
        {
            "type": "rect",
            "xref": "x",
            "yref": "paper",
            "x0": plot.clean([a - t0])[0],
            "x1": plot.clean([b - t0])[0],
            "y0": 0,
            "y1": 1,
            "fillcolor": _EVAL_COLOR,
            "line": {"width": 0},
            "layer": "below",
        }
        for a, b in lowest[["start", "end"]].to_numpy(dtype=float)[:max_points]
    ]


def _lowest_rank(steps: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The steps of the lowest rank (rank 0) on its own host, in step order, and a label for it."""
    lowest = steps["rank"] == steps["rank"].min()
    hosts = steps["host"].astype(str)
    host = hosts[lowest].min()
    rank = steps[lowest & (hosts == host)].sort_values("step")
    label = f"rank {int(rank['rank'].iloc[0])}"
    return rank, label + (f" on {host}" if hosts.nunique() > 1 else "")


def _breakdown(steps: pd.DataFrame, max_points: int) -> tuple[dict[str, Any], str]:
    """Stacked bars per step of the lowest rank: data wait, forward, backward, optimizer, other
    where the hooks measured them (GPU time where CUDA events did), else data wait vs the rest; an
    unmeasured data wait is never drawn as zero, it stays inside "other" and the note says so.
    Where the training thread's CPU during the wait was measured, the wait is two bars: busy (on
    a CPU or ready for one: loading or unpickling batches itself) and the rest (asleep on workers
    or storage)."""
    rank, label = _lowest_rank(steps)
    phases, clock = step_phases(rank)
    n = len(rank)
    per = max(1, math.ceil(n / max_points))
    idx = np.arange(n) // per
    count = np.bincount(idx)
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
    x = rank["step"].to_numpy()[::per]
    names = {"other": "other" if split else "compute", "data_wait_cpu": _WAIT_CPU_BAR}
    traces = [
        {
            "type": "bar",
            "name": names.get(p, p.replace("_", " ")) + ", ms",
            "x": plot.clean(x),
            "y": plot.clean(1e3 * np.bincount(idx, v) / count),
            "marker": {"color": _PHASE_COLORS[p]},
        }
        for p, v in parts.items()
    ]
    title = "Per-step phases" if split else "Per-step breakdown: data wait vs compute"
    if split and clock == "cuda":
        title += " (forward, backward, optimizer: GPU time from CUDA events)"
    fig = plot.fig(traces, title, "step", "ms")
    fig["layout"] |= {"barmode": "stack", "bargap": 0}
    note = label
    if per > 1:
        note += f"; mean of every {per} steps"
    unknown = int(np.isnan(wait).sum())
    if unknown:
        note += (
            f"; data wait unknown for {unknown:,} of {n:,} steps (not measured for what fed the "
            "loop): their wait is inside " + ('"other"' if split else '"compute"')
        )
    return fig, note


def _histogram(steps: pd.DataFrame) -> dict[str, Any]:
    ms = 1e3 * steps["duration"].to_numpy(dtype=float)
    hi = float(np.percentile(ms, 99.5)) if len(ms) > 200 else float(ms.max())
    counts, edges = np.histogram(np.minimum(ms, hi), bins=60, range=(0.0, max(hi, 1e-3)))
    fig = plot.fig(
        [
            {
                "type": "bar",
                "x": plot.clean(plot.centers(edges)),
                "y": counts.tolist(),
                "marker": {"color": "#2563eb"},
                "name": "steps",
            }
        ],
        "Step time histogram (longest 0.5% in the last bin)"
        if len(ms) > 200
        else "Step time histogram",
        "ms",
        "steps",
    )
    fig["layout"]["bargap"] = 0.02
    return fig


def _roles(run: Run, edges: np.ndarray, t0: float) -> dict[str, Any] | None:
    cores = role_totals(run, edges, "cpu", absent=0.0) / 100.0
    if len(cores.columns) == 0:
        return None
    traces = []
    for role in cores.columns:
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "stackgroup": "roles",
                "stackgaps": "interpolate",  # a bin no sample fell in is unknown, not 0 cores
                "name": plot.label(f"{role} processes"),
                "x": plot.clean(plot.centers(edges) - t0),
                "y": plot.clean(cores[role].to_numpy(dtype=float)),
                "line": {"color": _ROLE_COLORS.get(str(role), "#64748b")},
            }
        )
    return plot.fig(traces, "CPU by process role (cores busy)", "seconds", "cores")


def _ranks(steps: pd.DataFrame) -> dict[str, Any]:
    g = steps.groupby(["host", "rank"])
    multi = steps["host"].nunique() > 1
    labels = [plot.label(f"{h}:rank {r}" if multi else f"rank {r}") for h, r in g.groups]
    wait = 1e3 * g["data_wait"].mean().fillna(0.0).to_numpy()  # unknown waits stay in compute
    step = 1e3 * g["duration"].mean().to_numpy()
    traces = [
        {
            "type": "bar",
            "name": "data wait, ms",
            "x": labels,
            "y": plot.clean(wait),
            "marker": {"color": "#f59e0b"},
        },
        {
            "type": "bar",
            "name": "compute, ms",
            "x": labels,
            "y": plot.clean(step - wait),
            "marker": {"color": "#2563eb"},
        },
    ]
    fig = plot.fig(traces, "Ranks: mean step time", "", "ms")
    fig["layout"]["barmode"] = "stack"
    return fig


def _memory(run: Run, edges: np.ndarray, t0: float) -> dict[str, Any] | None:
    traces = []
    x = plot.clean(plot.centers(edges) - t0)
    for metric, what in (("mem.used", "host"), ("gpu.mem_used", "GPU")):
        rows = run.system[run.system["metric"] == metric]
        for (host, device), g in rows.groupby(["host", "device"]):
            name = f"{what} {device}".strip() + (f" ({host})" if rows["host"].nunique() > 1 else "")
            traces.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "name": plot.label(name),
                    "x": x,
                    "y": plot.clean(
                        plot.binned(g["time"], g["value"] / UNITS["bytes"].divisor, edges)
                    ),
                }
            )
    return plot.fig(traces, "Memory used", "seconds", UNITS["bytes"].shown) if traces else None
