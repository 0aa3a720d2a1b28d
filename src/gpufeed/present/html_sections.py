"""The HTML report's sections in words: the summary cards, the healthy-run sentence, the parts of a
training step and the percentile table, with the figures said the report's way."""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from gpufeed.analysis.schema import unit
from gpufeed.analysis.stats import PHASES
from gpufeed.present.numbers import after_warmup, ceiling_text, count, cpu_counts, figure, number

if TYPE_CHECKING:
    from gpufeed.analysis.result import Analysis
    from gpufeed.analysis.run import Run


def summary_cards(run: Run, analysis: Analysis, t0: float, t1: float) -> list[dict[str, str]]:
    """The summary cards (label, value, detail): duration, phases, steps, throughput, step time,
    data wait, evaluation, own ceiling, GPU and CPU utilization."""
    s = analysis.summary
    steady, ceiling = analysis.steady, analysis.ceiling
    ph = {r.phase: r.duration for r in analysis.phases.itertuples()}
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
            + (f"; {note}" if (note := analysis.wait_note) else "")
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
    gpu50, gpu95 = analysis.utilization["gpu.util"]
    gpu = math.isfinite(gpu50)  # NaN: no GPU samples
    cards.append(
        {
            "label": "GPU busy p50",
            "value": _num(gpu50, "%") if gpu else "n/a",
            "detail": f"p95 {_num(gpu95, '%')} · % of time a kernel ran" if gpu else "no GPU data",
        }
    )
    cpu50, cpu95 = analysis.utilization["cpu.util"]
    cards.append(
        {
            "label": "CPU utilization p50",
            "value": _num(cpu50, "%"),
            "detail": f"p95 {_num(cpu95, '%')} of {cpu_counts(meta)} cores",
        }
    )
    return cards


def healthy_text(analysis: Analysis) -> str:
    """What the rules checked, said when none found anything."""
    s = analysis.summary
    if not s["steps"]:
        return (
            f"No training steps were recorded ({analysis.no_steps}), so the step-based rules had "
            "nothing to judge."
        )
    wait = (
        f"{_num(100 * s['data_wait_share'], '%', 1)} of step time"
        if math.isfinite(s["data_wait_share"])
        else "unknown (not measured for what fed this loop)"
    )
    return (
        f"{len(analysis.checks)} rules checked {s['steps']:,} steps: data wait is "
        f"{wait} and step time p95 / p50 is "
        f"{s['step_p95'] / s['step_p50']:.2f}."
    )


def percentile_rows(analysis: Analysis) -> tuple[list[str], list[list[str]]]:
    """The percentile table (per host where the run has several): its column names and its rows
    as text."""
    table = analysis.host_percentiles
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


def step_phase_rows(analysis: Analysis) -> list[dict[str, str]]:
    """Rows (phase, share of step time, mean per step) for the parts of a training step; "unknown"
    where a part was not measured (data wait outside a DataLoader, phases of an older run). The
    model's phases are GPU time where CUDA events measured it ("(GPU)" after their names)."""
    means = analysis.phase_means
    if not means:
        return []
    s = analysis.summary
    clock = s["phase_clock"]
    rows = []
    for p in PHASES:
        share, mean = s[f"{p}_share"], means[p]
        known = math.isfinite(share) and math.isfinite(mean)
        on_gpu = clock == "cuda" and p in ("forward", "backward", "optimizer")
        rows.append(
            {
                "phase": p.replace("_", " ") + (" (GPU)" if on_gpu else ""),
                "share": _num(100 * share, "%", 1) if known else "unknown",
                "mean": _num(1e3 * mean, " ms", 2) if known else "unknown",
            }
        )
    return rows


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


def clock_text(epoch: float) -> str:
    """A Unix time as a UTC date and time; "unknown start" for none."""
    if not epoch:
        return "unknown start"
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
