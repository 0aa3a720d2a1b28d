"""`Analysis`: everything analytic a command shows of a run, computed once (`analyze_run`): the
findings, every rule's verdict, the steady-state data wait, the job's own ceiling and the summary
frames the presenters read. Presenters render it and compute nothing of their own."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpufeed.analysis.rules.context import WARMUP_ID, Context
from gpufeed.analysis.rules.registry import RULES, check_all, checked_overrides
from gpufeed.analysis.stats import (
    no_steps_note,
    percentile_table,
    phases,
    role_totals,
    run_span,
    step_summary,
    time_bins,
    wait_cpu_note,
)

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
    span: tuple[float, float]
    """The run's (start, end) in epoch seconds (`stats.run_span`)."""
    summary: dict[str, Any]
    """The training steps' figures (`stats.step_summary`)."""
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
    roles: tuple[pd.DataFrame, pd.DataFrame] | None
    """Per process role: summed CPU and peak RSS per sample time (`stats.role_totals`), or None
    where no process was sampled."""


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


def analyze_run(run: Run, overrides: Mapping[str, Any] | None = None) -> Analysis:
    """`run` analyzed once with `overrides` (`config.resolve`: "RULE" → its parameters): one
    `Context` for the rules and the steady-state figures. A bad override is a `ConfigError`."""
    checked = checked_overrides(overrides or {})
    ctx = Context(run, checked.get(WARMUP_ID))
    findings = check_all(ctx, checked)
    summary = step_summary(run)
    table = percentile_table(run)
    several = len(run.meta.get("hosts") or []) > 1
    span = run_span(run)
    roles = None
    if len(run.processes):
        edges = time_bins(run, *span, most=1_000_000)
        roles = role_totals(run, edges, "cpu"), role_totals(run, edges, "rss", how="max")
    return Analysis(
        findings=findings,
        checks=rule_checks(findings, checked),
        steady=ctx.steady_wait(),
        ceiling=ctx.ceiling,
        span=span,
        summary=summary,
        no_steps="" if summary["steps"] else no_steps_note(run),
        wait_note=wait_cpu_note(summary),
        phases=phases(run),
        percentiles=table,
        host_percentiles=percentile_table(run, by_host=True) if several else table,
        roles=roles,
    )
