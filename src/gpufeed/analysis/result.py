"""`Analysis`: everything analytic a command shows of a run, computed once (`analyze_run`): the
findings, every rule's verdict, the steady-state data wait, the job's own ceiling, the summary
figures and frames, the run's `Timeline` and the report's chart series. Presenters render it and
compute nothing of their own."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gpufeed.analysis.charts import CHART_POINTS, ChartData, chart_data
from gpufeed.analysis.rules.context import WARMUP_ID, Context
from gpufeed.analysis.rules.registry import RULES, check_all, checked_overrides
from gpufeed.analysis.stats import (
    PHASES,
    no_steps_note,
    percentile_table,
    phases,
    role_totals,
    step_phases,
    step_summary,
    time_bins,
    wait_cpu_note,
)
from gpufeed.analysis.timeline import Timeline, timeline

if TYPE_CHECKING:
    import pandas as pd

    from gpufeed.analysis.finding import Finding
    from gpufeed.analysis.headspace import Ceiling
    from gpufeed.analysis.run import Run

_SEVERITIES = ("info", "warning", "critical")


@dataclass(frozen=True)
class Analysis:
    """A run analyzed once: what `show`, the report and the JSON findings render."""

    findings: list[Finding]
    """Every enabled rule's findings, most impactful first."""
    checks: list[dict[str, str]]
    """Every built-in rule with what it checks and its verdict (`rule_checks`)."""
    steady: tuple[int, float] | None
    """(warm-up steps left out, data-wait share after them) (`Context.steady_wait`)."""
    ceiling: Ceiling | None
    """The job's own ceiling where `--headspace` measured it."""
    timeline: Timeline
    """The run's span, timed steps and evaluation passes (`analysis.timeline`)."""
    charts: ChartData
    """The report's chart series (`analysis.charts`)."""
    summary: dict[str, Any]
    """The training steps' figures (`stats.step_summary`)."""
    phase_means: dict[str, float]
    """Each part of a training step (`stats.PHASES`): its mean per step in seconds where measured
    (NaN where not), on the clock `summary["phase_clock"]` names; empty without timed steps."""
    utilization: dict[str, tuple[float, float]]
    """"gpu.util" and "cpu.util": (p50, p95) over every device's samples; NaN where none."""
    no_steps: str
    """Why no training step was recorded (`stats.no_steps_note`); "" where some were."""
    wait_note: str | None
    """What the training processes' CPU did while waiting for data (`stats.wait_cpu_note`)."""
    phases: pd.DataFrame
    """The run's phases and their durations (`stats.phases`)."""
    percentiles: pd.DataFrame
    """Every system metric's percentiles per device (`stats.percentile_table`)."""
    host_percentiles: pd.DataFrame
    """The same per host and device where the run has several hosts, else `percentiles`."""
    process_roles: list[dict[str, Any]]
    """Per process role sampled ("main", "worker", "other"): `role`, `processes` (how many),
    `cpu_p50` and `cpu_p95` (% of one core, summed over the role's processes and hosts per time
    bin: `stats.role_totals`) and `peak_rss` (bytes); empty where no process was sampled."""

    @property
    def span(self) -> tuple[float, float]:
        """The run's (start, end) in epoch seconds (`stats.run_span`)."""
        return self.timeline.span


def rule_checks(findings: list[Finding], checked: Mapping[str, Any]) -> list[dict[str, str]]:
    """Every built-in rule with what it checks and its verdict on this run: "passed", the severity
    of what it found, or "disabled" (by `--set RULE.enabled=false` or a config file); `checked`:
    the validated overrides."""
    worst: dict[str, str] = {}
    for f in findings:
        if _SEVERITIES.index(f.severity) >= _SEVERITIES.index(worst.get(f.rule, "info")):
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


def analyze_run(
    run: Run, overrides: Mapping[str, Any] | None = None, chart_points: int = CHART_POINTS
) -> Analysis:
    """`run` analyzed once with `overrides` (`config.resolve`: "RULE" → its parameters): one
    `Context` for the rules and the steady-state figures, the report's charts binned to at most
    `chart_points` per series. A bad override is a `ConfigError`."""
    checked = checked_overrides(overrides or {})
    ctx = Context(run, checked.get(WARMUP_ID))
    findings = check_all(ctx, checked)
    summary = step_summary(run)
    table = percentile_table(run)
    several = len(run.meta.get("hosts") or []) > 1
    line = timeline(run)
    return Analysis(
        findings=findings,
        checks=rule_checks(findings, checked),
        steady=ctx.steady_wait(),
        ceiling=ctx.ceiling,
        timeline=line,
        charts=chart_data(run, line, chart_points),
        summary=summary,
        phase_means=_phase_means(line.steps),
        utilization={m: _utilization(run, m) for m in ("gpu.util", "cpu.util")},
        no_steps="" if summary["steps"] else no_steps_note(run),
        wait_note=wait_cpu_note(summary),
        phases=phases(run),
        percentiles=table,
        host_percentiles=percentile_table(run, by_host=True) if several else table,
        process_roles=_process_roles(run, line.span),
    )


def _phase_means(steps: pd.DataFrame) -> dict[str, float]:
    """Each PHASES' mean per timed step where measured (NaN where never)."""
    if len(steps) == 0:
        return {}
    parts, _ = step_phases(steps)
    means = {}
    for p in PHASES:
        values = parts[p].to_numpy(dtype=float)
        values = values[np.isfinite(values)]
        means[p] = float(values.mean()) if values.size else math.nan
    return means


def _utilization(run: Run, metric: str) -> tuple[float, float]:
    """(p50, p95) of `metric` over all its devices' finite samples; NaN where none."""
    v = run.system.loc[run.system["metric"] == metric, "value"].to_numpy(dtype=float)
    v = v[np.isfinite(v)]
    if not v.size:
        return math.nan, math.nan
    return float(np.percentile(v, 50)), float(np.percentile(v, 95))


def _process_roles(run: Run, span: tuple[float, float]) -> list[dict[str, Any]]:
    """`Analysis.process_roles`: per role, its processes, CPU percentiles and peak memory."""
    procs = run.processes
    if len(procs) == 0:
        return []
    edges = time_bins(run, *span, most=1_000_000)
    cpus = role_totals(run, edges, "cpu")
    rss = role_totals(run, edges, "rss", how="max")
    rows = []
    for role in ("main", "worker", "other"):
        mine = procs[procs["role"] == role]
        if len(mine) == 0:
            continue
        cpu = cpus[role].dropna()
        rows.append(
            {
                "role": role,
                "processes": mine[["host", "pid"]].drop_duplicates().shape[0],
                "cpu_p50": float(cpu.quantile(0.5)),
                "cpu_p95": float(cpu.quantile(0.95)),
                "peak_rss": float(rss[role].max()),
            }
        )
    return rows
