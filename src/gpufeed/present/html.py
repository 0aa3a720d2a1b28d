"""The HTML report: one self-contained, offline file (plotly.js inlined, and said so) with summary,
findings, every rule's verdict and charts.

Every string from the run goes through jinja2 autoescaping (HTML) or `html.escape` (chart labels,
which plotly renders as pseudo-HTML); chart data are binned to at most `max_points` per series (step
time: means of consecutive steps) so that plotly.js stays the only large part, also for a 24-hour run.
"""

from __future__ import annotations

import html
import json
import math
import shlex
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gpufeed.analysis.schema import UNITS, unit
from gpufeed.analysis.stats import bin_index, device_key, role_totals, time_bins
from gpufeed.present.numbers import (
    after_warmup,
    ceiling_text,
    count,
    cpu_counts,
    damaged_text,
    figure,
    number,
)

if TYPE_CHECKING:
    import pandas as pd

    from gpufeed.analysis.finding import Finding
    from gpufeed.analysis.headspace import Ceiling
    from gpufeed.analysis.run import Run

MAX_POINTS = 1200
_PLOTLY_MARK = "\x00gpufeed-plotly-js\x00"
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
_LABELLED_ROWS = 42  # rows of a heatmap that fit 900 px with a label each
_LAYOUT = {
    "margin": {"l": 60, "r": 60, "t": 40, "b": 80},
    "height": 340,
    "font": {"size": 12},
    "paper_bgcolor": "#ffffff",
    "plot_bgcolor": "#ffffff",
    # below the x-axis title, not over it
    "legend": {"orientation": "h", "y": -0.26, "yanchor": "top"},
}


def json_safe(value: Any) -> Any:
    """`value` with every float that is not finite (NaN, inf) replaced by None, in nested dicts and
    lists: strict JSON has no NaN, and `null` is what other tools read as "not measured"."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def strict_json(value: Any, **kwargs: Any) -> str:
    """`json.dumps` that never writes NaN or Infinity (invalid JSON): non-finite floats become null."""
    try:
        return json.dumps(value, allow_nan=False, **kwargs)
    except ValueError:  # a NaN somewhere: clean the whole tree (only then, it costs a walk)
        return json.dumps(json_safe(value), allow_nan=False, **kwargs)


def readable(text: str) -> str:
    """`text` with the bytes that were not UTF-8 (lone surrogates from a name or command given in
    another encoding) written as visible escapes like `\\xe9`, so it can be written as UTF-8."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate no byte maps to
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def findings_json(run: Run, findings: list[Finding]) -> str:
    """Findings for machines: run identity, `dropped_events` (profiler events lost: the figures
    miss them), `damaged_stores` (store files left out, unreadable), `healthy` (no warning or worse) and each finding's dict; strict JSON (a value that was not measured is null, never NaN)."""
    return strict_json(
        {
            "run": str(run.path),
            "name": run.meta.get("name"),
            "finished": bool(run.meta.get("finished")),
            "dropped_events": int(run.meta.get("dropped_events") or 0),
            "damaged_stores": list(run.meta.get("damaged_stores") or []),
            "healthy": not any(f.severity != "info" for f in findings),
            "findings": [f.to_dict() for f in findings],
        },
        indent=2,
    )


def rule_checks(
    findings: list[Finding], overrides: dict[str, Any] | None = None
) -> list[dict[str, str]]:
    """Every built-in rule with what it checks and its verdict on this run: "passed", the severity
    of what it found, or "disabled" (by `--set RULE.enabled=false` or a config file)."""
    from gpufeed.analysis.rules import RULES, validate

    checked = validate(overrides or {})
    worst: dict[str, str] = {}
    order = ("info", "warning", "critical")
    for f in findings:
        if order.index(f.severity) >= order.index(worst.get(f.rule, "info")):
            worst[f.rule] = f.severity
    return [
        {
            "rule": rid,
            "checks": rule.summary(),
            "verdict": worst.get(rid, "passed")
            if rule.resolve(checked.get(rid))["enabled"]
            else "disabled",
        }
        for rid, rule in RULES.items()
    ]


def render_html(
    run: Run,
    findings: list[Finding],
    max_points: int = MAX_POINTS,
    checks: list[dict[str, str]] | None = None,
    steady: tuple[int, float] | None = None,
    stopped: str | None = None,
    ceiling: Ceiling | None = None,
) -> str:
    """The report as one HTML string; `checks` (from `rule_checks`) defaults to the default rules';
    `steady` (from `Context.steady_wait`) adds the data wait after warm-up to the summary, and
    `ceiling` (`Context.ceiling`) the job's share of its own ceiling where it was measured;
    `stopped` (from `recording_stopped`) says why an unfinished run will never finish, which the
    header then says instead of "run still in progress"."""
    import jinja2
    import plotly.offline

    from gpufeed import __version__
    from gpufeed.analysis.stats import run_span
    from gpufeed.profiler.redact import redact_argv, redact_value

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("gpufeed.present", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.policies["json.dumps_function"] = strict_json  # chart data: null, never NaN
    meta = run.meta
    t0, t1 = run_span(run)
    if not math.isfinite(t0):
        t0, t1 = 0.0, 0.0
    charts, figures, missing = _charts(run, t0, t1, max_points)
    columns, rows = _percentiles(run)
    gpus = meta.get("gpus") or []
    command = meta.get("command") or []
    # Redacted again: a meta.json from an older gpufeed may hold what today's redaction hides.
    command = (
        shlex.join(redact_argv(str(c) for c in command))
        if isinstance(command, list)
        else redact_value(str(command))
    )
    plotly_js = plotly.offline.get_plotlyjs()
    page = env.get_template("report.html").render(
        name=str(meta.get("name") or Path(str(run.path)).name),
        command=command,
        hosts=", ".join(str(h) for h in meta.get("hosts") or []) or "unknown host",
        started=_clock(t0),
        cpu=f"{cpu_counts(meta)} cores ({meta.get('cpu_model') or 'unknown CPU'})",
        gpus=", ".join(str(g.get("name")) for g in gpus)
        if gpus
        else f"no GPU data ({meta.get('gpu_unavailable') or 'none reported'})",
        finished=bool(meta.get("finished")),
        unfinished=stopped or meta.get("not_finished") or "",
        live=not meta.get("finished") and stopped is None,
        dropped=int(meta.get("dropped_events") or 0),
        damaged=damaged_text(meta["damaged_stores"]) if meta.get("damaged_stores") else "",
        generated=datetime.now().strftime("%Y-%m-%d %H:%M:%S"),
        summary=_summary(run, t0, t1, steady, ceiling),
        step_phases=_step_phases(run),
        findings=[f.to_dict() for f in findings],
        checks=checks if checks is not None else rule_checks(findings),
        healthy=_healthy_text(run),
        charts=charts,
        missing=missing,
        percentile_columns=columns,
        percentiles=rows,
        version=__version__,
        downsample_note=f"charts binned to at most {max_points} points per series",
        plotly_js=_PLOTLY_MARK,
        figures=figures,
        offline_note=_PLOTLY_MARK,
    )
    page = readable(page)  # e.g. a name given in Latin-1: shown escaped, never a failed write
    # plotly.js is inlined so that the report opens offline (air-gapped clusters, mail attachments);
    # it is the only large part, and the report says so with both sizes.
    own = len(page.encode()) - 2 * len(_PLOTLY_MARK)
    note = (
        f"works offline: plotly.js {plotly.__version__} is inlined "
        f"({len(plotly_js.encode()) / 1e6:.1f} MB); this run's data and text take {own / 1e3:,.0f} kB"
    )
    head, rest = page.split(_PLOTLY_MARK, 1)
    return head + html.escape(note) + rest.replace(_PLOTLY_MARK, plotly_js, 1)


# --- summary ------------------------------------------------------------------------------------


def _summary(
    run: Run, t0: float, t1: float, steady: tuple[int, float] | None, ceiling: Ceiling | None
) -> list[dict[str, str]]:
    from gpufeed.analysis.stats import phases, step_summary, wait_cpu_note

    s = step_summary(run)
    ph = {r.phase: r.duration for r in phases(run).itertuples()}
    meta = run.meta
    status = (
        f"exit code {meta.get('exit_code')}" if meta.get("finished") else "still running or killed"
    )
    cards = [
        {"label": "Duration", "value": _secs(t1 - t0), "detail": status},
        {
            "label": "Phases",
            "value": _secs(ph.get("training", 0.0)) + " training",
            "detail": f"init {_secs(ph.get('initialization', 0.0))} · "
            + (f"evaluation {_secs(ph['evaluation'])} · " if "evaluation" in ph else "")
            + f"finalization {_secs(ph.get('finalization', 0.0))}",
        },
        {"label": "Steps", "value": f"{s['steps']:,}", "detail": count(s["ranks"], "rank")},
        {
            "label": "Throughput",
            "value": figure(s["samples_per_s"], " samples/s", missing="n/a"),
            "detail": figure(s["steps_per_s"], " steps/s per rank", missing="n/a"),
        },
        {
            "label": "Step time p50",
            "value": figure(1e3 * s["step_p50"], " ms", missing="n/a"),
            "detail": "p95 " + figure(1e3 * s["step_p95"], " ms", missing="n/a"),
        },
        {
            "label": "Data wait",
            "value": _num(100 * s["data_wait_share"], "%", 1)
            if math.isfinite(s["data_wait_share"])
            else "unknown",
            "detail": "of step time (wait / whole step)"
            + (f", every step; {judged}" if (judged := after_warmup(steady, s["ranks"])) else "")
            + (f"; {note}" if (note := wait_cpu_note(s)) else "")
            if math.isfinite(s["data_wait_share"])
            else "not measured for what fed this loop (never read as 0%)",
        },
    ]
    if own := ceiling_text(ceiling, meta):
        share = number(100 * ceiling.share, 0, "%") if ceiling is not None else "not measured"
        cards.append({"label": "Own ceiling", "value": share, "detail": own})
    if s["eval_passes"]:
        cards.insert(
            2,
            {
                "label": "Evaluation",
                "value": _secs(s["eval_time"]),
                "detail": f"{count(s['eval_passes'], 'pass')}, apart from the training steps "
                f"({_secs(s['training_time'])})",
            },
        )
    gpu = _values(run, "gpu.util")
    cards.append(
        {
            "label": "GPU busy p50",
            "value": _num(_pct(gpu, 50), "%") if gpu.size else "n/a",
            "detail": f"p95 {_num(_pct(gpu, 95), '%')} · % of time a kernel ran"
            if gpu.size
            else "no GPU data",
        }
    )
    cpu = _values(run, "cpu.util")
    cards.append(
        {
            "label": "CPU utilization p50",
            "value": _num(_pct(cpu, 50), "%"),
            "detail": f"p95 {_num(_pct(cpu, 95), '%')} of {cpu_counts(meta)} cores",
        }
    )
    return cards


def _healthy_text(run: Run) -> str:
    from gpufeed.analysis.rules import RULES
    from gpufeed.analysis.stats import no_steps_note, step_summary

    s = step_summary(run)
    if not s["steps"]:
        return (
            f"No training steps were recorded ({no_steps_note(run)}), so the step-based rules had "
            "nothing to judge."
        )
    wait = (
        f"{_num(100 * s['data_wait_share'], '%', 1)} of step time"
        if math.isfinite(s["data_wait_share"])
        else "unknown (not measured for what fed this loop)"
    )
    return (
        f"{len(RULES)} rules checked {s['steps']:,} steps: data wait is "
        f"{wait} and step time p95 / p50 is "
        f"{s['step_p95'] / s['step_p50']:.2f}."
    )


def _percentiles(run: Run) -> tuple[list[str], list[list[str]]]:
    from gpufeed.analysis.stats import percentile_table

    table = percentile_table(run, by_host=len(run.meta.get("hosts") or []) > 1)
    names = list(table.index.names)
    columns = [*names, *table.columns]
    rows = []
    for key, values in table.iterrows():
        key = key if isinstance(key, tuple) else (key,)
        metric = key[names.index("metric")]
        rows.append(
            [str(k) for k in key] + [_metric_value(metric, v, c) for c, v in values.items()]
        )
    return columns, rows


def _metric_value(metric: str, value: float, column: str) -> str:
    if column == "n":
        return f"{int(value):,}"
    if (shown := unit(metric)).stored in ("bytes", "bytes/s"):  # GiB, MB/s: the schema's units
        return f"{value / shown.divisor:.{shown.decimals}f} {shown.shown}"
    return f"{value:.1f}"


def _step_phases(run: Run) -> list[dict[str, str]]:
    """Rows (phase, share of step time, mean per step) for the parts of a training step; "unknown"
    where a part was not measured (data wait outside a DataLoader, phases of an older run). The
    model's phases are GPU time where CUDA events measured it ("(GPU)" after their names)."""
    from gpufeed.analysis.stats import PHASES, step_phases, step_summary

    steps = run.steps[np.isfinite(run.steps["duration"].to_numpy(dtype=float))]
    if len(steps) == 0:
        return []
    s = step_summary(run)
    parts, clock = step_phases(steps)
    rows = []
    for p in PHASES:
        share = s[f"{p}_share"]
        values = parts[p].to_numpy(dtype=float)
        values = values[np.isfinite(values)]
        known = math.isfinite(share) and values.size > 0
        on_gpu = clock == "cuda" and p in ("forward", "backward", "optimizer")
        rows.append(
            {
                "phase": p.replace("_", " ") + (" (GPU)" if on_gpu else ""),
                "share": _num(100 * share, "%", 1) if known else "unknown",
                "mean": _num(1e3 * float(values.mean()), " ms", 2) if known else "unknown",
            }
        )
    return rows


# --- charts ---------------------------------------------------------------------------------------


def _charts(
    run: Run, t0: float, t1: float, max_points: int
) -> tuple[list[dict[str, Any]], dict[str, Any], list[str]]:
    """(chart placeholders for the template, plotly figures by element id, notes on absent charts)."""
    figs: dict[str, Any] = {}
    notes: dict[str, str] = {}
    missing: list[str] = []
    edges = time_bins(run, t0, t1, max_points)

    cores = _heatmap(run, "cpu.core", edges, t0, "core")
    if cores:
        figs["chart-cpu-cores"] = _rows_fig(cores, "CPU cores over time (% busy)")
    gpus = _heatmap(run, "gpu.util", edges, t0, "GPU")
    if gpus:
        figs["chart-gpus"] = _rows_fig(gpus, "GPUs over time: busy, " + GPU_UTIL_MEANS)
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
        z.append(_clean(_binned(g["time"], g["value"], edges)))
        labels.append(_label(f"{host}:{what} {device}" if multi else f"{what} {device}"))
    return [
        {
            "type": "heatmap",
            "x": _clean(_centers(edges) - t0),
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
            "x": _clean(_centers(edges) - t0),
            "y": _clean(_binned(rows["time"], rows["value"], edges)),
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
                "x": _clean(end - t0),
                "y": _clean(ms),
                "yaxis": "y2",
                "line": {"color": "#1d4ed8", "width": 2.5},
                "marker": {"size": 4},
                "connectgaps": True,
            }
        )
        note = "; ".join(filter(None, [f"step time of {label}", note]))
    title = ("GPU" if has_gpu else "CPU (no GPU data)") + " utilization and step time"
    fig = _fig(traces, title, "seconds", "%")
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
    from gpufeed.analysis.stats import evaluation_passes

    evals = evaluation_passes(run)
    if len(evals) == 0:
        return []
    lowest, _ = _lowest_rank(evals.assign(step=evals["start"]))
    return [
        {
            "type": "rect",
            "xref": "x",
            "yref": "paper",
            "x0": _clean([a - t0])[0],
            "x1": _clean([b - t0])[0],
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
    from gpufeed.analysis.stats import PHASES, step_phases

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
            "x": _clean(x),
            "y": _clean(1e3 * np.bincount(idx, v) / count),
            "marker": {"color": _PHASE_COLORS[p]},
        }
        for p, v in parts.items()
    ]
    title = "Per-step phases" if split else "Per-step breakdown: data wait vs compute"
    if split and clock == "cuda":
        title += " (forward, backward, optimizer: GPU time from CUDA events)"
    fig = _fig(traces, title, "step", "ms")
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
    fig = _fig(
        [
            {
                "type": "bar",
                "x": _clean(_centers(edges)),
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
                "name": _label(f"{role} processes"),
                "x": _clean(_centers(edges) - t0),
                "y": _clean(cores[role].to_numpy(dtype=float)),
                "line": {"color": _ROLE_COLORS.get(str(role), "#64748b")},
            }
        )
    return _fig(traces, "CPU by process role (cores busy)", "seconds", "cores")


def _ranks(steps: pd.DataFrame) -> dict[str, Any]:
    g = steps.groupby(["host", "rank"])
    multi = steps["host"].nunique() > 1
    labels = [_label(f"{h}:rank {r}" if multi else f"rank {r}") for h, r in g.groups]
    wait = 1e3 * g["data_wait"].mean().fillna(0.0).to_numpy()  # unknown waits stay in compute
    step = 1e3 * g["duration"].mean().to_numpy()
    traces = [
        {
            "type": "bar",
            "name": "data wait, ms",
            "x": labels,
            "y": _clean(wait),
            "marker": {"color": "#f59e0b"},
        },
        {
            "type": "bar",
            "name": "compute, ms",
            "x": labels,
            "y": _clean(step - wait),
            "marker": {"color": "#2563eb"},
        },
    ]
    fig = _fig(traces, "Ranks: mean step time", "", "ms")
    fig["layout"]["barmode"] = "stack"
    return fig


def _memory(run: Run, edges: np.ndarray, t0: float) -> dict[str, Any] | None:
    traces = []
    x = _clean(_centers(edges) - t0)
    for metric, what in (("mem.used", "host"), ("gpu.mem_used", "GPU")):
        rows = run.system[run.system["metric"] == metric]
        for (host, device), g in rows.groupby(["host", "device"]):
            name = f"{what} {device}".strip() + (f" ({host})" if rows["host"].nunique() > 1 else "")
            traces.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "name": _label(name),
                    "x": x,
                    "y": _clean(_binned(g["time"], g["value"] / UNITS["bytes"].divisor, edges)),
                }
            )
    return _fig(traces, "Memory used", "seconds", UNITS["bytes"].shown) if traces else None


# --- helpers ----------------------------------------------------------------------------------------


def _fig(data: list[dict[str, Any]], title: str, xtitle: str, ytitle: str) -> dict[str, Any]:
    layout = json.loads(json.dumps(_LAYOUT))
    layout |= {
        "title": {"text": title, "x": 0.01, "font": {"size": 14}},
        "xaxis": {"title": {"text": xtitle}},
        "yaxis": {"title": {"text": ytitle}},
    }
    return {"data": data, "layout": layout}


def _rows_fig(heatmap: list[dict[str, Any]], title: str) -> dict[str, Any]:
    """A heatmap figure as tall as its rows need, each row labelled in full (up to `_LABELLED_ROWS`
    rows; past that plotly picks which to label)."""
    fig = _fig(heatmap, title, "seconds", "")
    rows = len(heatmap[0]["y"])
    fig["layout"]["height"] = max(fig["layout"]["height"], min(900, 140 + 18 * rows))
    fig["layout"]["yaxis"] |= {"automargin": True}
    if rows <= _LABELLED_ROWS:
        fig["layout"]["yaxis"] |= {"dtick": 1}
    return fig


def _binned(times: Any, values: Any, edges: np.ndarray) -> np.ndarray:
    """Mean of `values` in each time bin (NaN where a bin is empty)."""
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


def _centers(edges: np.ndarray) -> np.ndarray:
    return (edges[:-1] + edges[1:]) / 2


def _clean(values: Any) -> list[float | None]:
    """JSON-safe list: NaN/inf become null, floats keep 4 significant digits to keep the file small."""
    return [
        float(f"{x:.4g}") if math.isfinite(x) else None for x in np.asarray(values, dtype=float)
    ]


def _values(run: Run, metric: str) -> np.ndarray:
    v = run.system.loc[run.system["metric"] == metric, "value"].to_numpy(dtype=float)
    return v[np.isfinite(v)]


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else math.nan


def _label(text: str) -> str:
    """A run-derived string made safe for plotly, which renders a subset of HTML in labels."""
    return html.escape(text, quote=True)


def _num(value: float, unit: str = "", digits: int = 0) -> str:
    return number(value, digits, unit, missing="n/a")


def _secs(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "n/a"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _clock(epoch: float) -> str:
    if not epoch:
        return "unknown start"
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
