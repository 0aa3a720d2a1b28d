"""The HTML report's charts: plotly figures of the run (CPU cores and GPUs over time, utilization
with step time, per-step phases, the step time histogram, CPU by process role, ranks, memory), with
the template's placeholders and notes. The figures come computed and binned (`analysis.charts`:
at most `ChartData.points` per series); this module only draws them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpufeed.analysis.schema import UNITS
from gpufeed.present import html_figures as plot

if TYPE_CHECKING:
    from gpufeed.analysis.charts import Breakdown, ChartData, HeatRow, Histogram, RankBars

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
    data: ChartData, gpu_unavailable: str | None = None
) -> tuple[list[dict[str, Any]], dict[str, Any], list[str]]:
    """(chart placeholders for the template, plotly figures by element id, notes on absent charts)
    of the run's `data` (`Analysis.charts`); `gpu_unavailable`: why the run has no GPU data."""
    figs: dict[str, Any] = {}
    notes: dict[str, str] = {}
    missing: list[str] = []

    cores = _heatmap(data.cores, data, "core")
    if cores:
        figs["chart-cpu-cores"] = plot.rows_fig(cores, "CPU cores over time (% busy)")
    gpus = _heatmap(data.gpus, data, "GPU")
    if gpus:
        figs["chart-gpus"] = plot.rows_fig(gpus, "GPUs over time: busy, " + GPU_UTIL_MEANS)
    else:
        missing.append(f"No GPU heatmap: {gpu_unavailable or 'NVML reported no GPUs'}.")

    figs["chart-util-steps"], notes["chart-util-steps"] = _util_vs_steps(data, bool(gpus))
    if data.breakdown is not None and data.histogram is not None:
        figs["chart-step-breakdown"], notes["chart-step-breakdown"] = _breakdown(data.breakdown)
        figs["chart-step-hist"] = _histogram(data.histogram)
    else:
        missing.append("No per-step charts: the run recorded no steps.")
    roles = _roles(data)
    if roles:
        figs["chart-roles"] = roles
    if data.ranks is not None:
        figs["chart-ranks"] = _ranks(data.ranks)
    memory = _memory(data)
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


def _heatmap(rows: list[HeatRow], data: ChartData, what: str) -> list[dict[str, Any]]:
    if not rows:
        return []
    multi = len({r.host for r in rows}) > 1
    return [
        {
            "type": "heatmap",
            "x": plot.clean(data.x),
            "y": [
                plot.label(f"{r.host}:{what} {r.device}" if multi else f"{what} {r.device}")
                for r in rows
            ],
            "z": [plot.clean(r.values) for r in rows],
            "zmin": 0,
            "zmax": 100,
            "colorscale": "Viridis",
            "colorbar": {"title": {"text": "%"}},
        }
    ]


def _util_vs_steps(data: ChartData, has_gpu: bool) -> tuple[dict[str, Any], str]:
    """Utilization (binned) with the step time of the lowest rank over it, step by step (a mean of
    consecutive steps past `data.points`), drawn as one connected line on top."""
    name = "GPU busy (mean of GPUs)" if has_gpu else "host CPU utilization"
    traces = [
        {
            "type": "scatter",
            "mode": "lines",
            "name": f"{name}, %",
            "x": plot.clean(data.x),
            "y": plot.clean(data.util),
            "line": {"color": "#86efac", "width": 1},
            "fill": "tozeroy",
            "fillcolor": "rgba(134, 239, 172, 0.35)",
        }
    ]
    note = GPU_UTIL_MEANS if has_gpu else ""
    line = data.step_line
    if line is not None:
        per = line.per
        traces.append(
            {
                "type": "scatter",
                "mode": "lines+markers" if len(line.ms) <= 200 else "lines",
                "name": "step time, ms" + (f" (mean of every {per} steps)" if per > 1 else ""),
                "x": plot.clean(line.x),
                "y": plot.clean(line.ms),
                "yaxis": "y2",
                "line": {"color": "#1d4ed8", "width": 2.5},
                "marker": {"size": 4},
                "connectgaps": True,
            }
        )
        note = "; ".join(filter(None, [f"step time of {line.label}", note]))
    title = ("GPU" if has_gpu else "CPU (no GPU data)") + " utilization and step time"
    fig = plot.fig(traces, title, "seconds", "%")
    bands = _eval_bands(data)
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


def _eval_bands(data: ChartData) -> list[dict[str, Any]]:
    """Shaded x-ranges for the lowest rank's evaluation passes."""
    return [
        {
            "type": "rect",
            "xref": "x",
            "yref": "paper",
            "x0": plot.clean([a])[0],
            "x1": plot.clean([b])[0],
            "y0": 0,
            "y1": 1,
            "fillcolor": _EVAL_COLOR,
            "line": {"width": 0},
            "layer": "below",
        }
        for a, b in data.eval_bands
    ]


def _breakdown(data: Breakdown) -> tuple[dict[str, Any], str]:
    """Stacked bars per step of the lowest rank (`ChartData.breakdown`): data wait, forward,
    backward, optimizer, other where the hooks measured them (GPU time where CUDA events did), else
    data wait vs compute; the wait split into the training thread busy and the rest where measured."""
    split = data.split
    names = {"other": "other" if split else "compute", "data_wait_cpu": _WAIT_CPU_BAR}
    traces = [
        {
            "type": "bar",
            "name": names.get(p, p.replace("_", " ")) + ", ms",
            "x": plot.clean(data.x),
            "y": plot.clean(v),
            "marker": {"color": _PHASE_COLORS[p]},
        }
        for p, v in data.parts.items()
    ]
    title = "Per-step phases" if split else "Per-step breakdown: data wait vs compute"
    if split and data.clock == "cuda":
        title += " (forward, backward, optimizer: GPU time from CUDA events)"
    fig = plot.fig(traces, title, "step", "ms")
    fig["layout"] |= {"barmode": "stack", "bargap": 0}
    note = data.label
    if data.per > 1:
        note += f"; mean of every {data.per} steps"
    if data.unknown:
        note += (
            f"; data wait unknown for {data.unknown:,} of {data.steps:,} steps (not measured for "
            "what fed the loop): their wait is inside " + ('"other"' if split else '"compute"')
        )
    return fig, note


def _histogram(data: Histogram) -> dict[str, Any]:
    fig = plot.fig(
        [
            {
                "type": "bar",
                "x": plot.clean(data.centers),
                "y": data.counts.tolist(),
                "marker": {"color": "#2563eb"},
                "name": "steps",
            }
        ],
        "Step time histogram (longest 0.5% in the last bin)"
        if data.clipped
        else "Step time histogram",
        "ms",
        "steps",
    )
    fig["layout"]["bargap"] = 0.02
    return fig


def _roles(data: ChartData) -> dict[str, Any] | None:
    if not data.roles:
        return None
    traces = []
    for role, cores in data.roles.items():
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "stackgroup": "roles",
                "stackgaps": "interpolate",  # a bin no sample fell in is unknown, not 0 cores
                "name": plot.label(f"{role} processes"),
                "x": plot.clean(data.x),
                "y": plot.clean(cores),
                "line": {"color": _ROLE_COLORS.get(str(role), "#64748b")},
            }
        )
    return plot.fig(traces, "CPU by process role (cores busy)", "seconds", "cores")


def _ranks(data: RankBars) -> dict[str, Any]:
    multi = data.several_hosts
    labels = [plot.label(f"{h}:rank {r}" if multi else f"rank {r}") for h, r in data.ranks]
    traces = [
        {
            "type": "bar",
            "name": "data wait, ms",
            "x": labels,
            "y": plot.clean(data.wait_ms),
            "marker": {"color": "#f59e0b"},
        },
        {
            "type": "bar",
            "name": "compute, ms",
            "x": labels,
            "y": plot.clean(data.compute_ms),
            "marker": {"color": "#2563eb"},
        },
    ]
    fig = plot.fig(traces, "Ranks: mean step time", "", "ms")
    fig["layout"]["barmode"] = "stack"
    return fig


def _memory(data: ChartData) -> dict[str, Any] | None:
    traces = []
    x = plot.clean(data.x)
    for line in data.memory:
        name = f"{line.what} {line.device}".strip() + (
            f" ({line.host})" if line.several_hosts else ""
        )
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": plot.label(name),
                "x": x,
                "y": plot.clean(line.values),
            }
        )
    return plot.fig(traces, "Memory used", "seconds", UNITS["bytes"].shown) if traces else None
