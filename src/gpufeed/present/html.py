"""The HTML report: one self-contained, offline file (plotly.js inlined, and said so) with summary,
findings, every rule's verdict and charts.

Every string from the run goes through jinja2 autoescaping (HTML) or `html.escape` (chart labels,
which plotly renders as pseudo-HTML); chart data come computed and binned (`analysis.charts`: at
most `CHART_POINTS` per series; step time: means of consecutive steps) so that plotly.js stays the
only large part, also for a 24-hour run.

This module assembles the template's context; the sections' words are `html_sections`', the charts
`html_charts`' (their building blocks `html_figures`'), strict JSON `safe_json`'s.
"""

from __future__ import annotations

import html
import math
import shlex
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from gpufeed.analysis.charts import CHART_POINTS
from gpufeed.present import html_charts
from gpufeed.present.html_charts import GPU_UTIL_MEANS
from gpufeed.present.html_sections import (
    clock_text,
    healthy_text,
    percentile_rows,
    step_phase_rows,
    summary_cards,
)
from gpufeed.present.numbers import cpu_counts, damaged_text
from gpufeed.present.safe_json import json_safe, strict_json

if TYPE_CHECKING:
    from gpufeed.analysis.finding import Finding
    from gpufeed.analysis.result import Analysis
    from gpufeed.analysis.run import Run

__all__ = [
    "GPU_UTIL_MEANS",
    "MAX_POINTS",
    "findings_json",
    "json_safe",
    "readable",
    "render_html",
    "strict_json",
]

MAX_POINTS = CHART_POINTS  # the most points per chart series (`analyze_run`'s `chart_points`)
_PLOTLY_MARK = "\x00gpufeed-plotly-js\x00"


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


def render_html(
    run: Run,
    analysis: Analysis,
    stopped: str | None = None,
) -> str:
    """The report as one HTML string of `run` and what `analysis.result.analyze_run` found in it
    (findings, every rule's verdict, the steady-state data wait, the own ceiling, the summary
    figures, the charts' series); `stopped` (from `recording_stopped`) says why an unfinished run will never finish,
    which the header then says instead of "run still in progress"."""
    import jinja2
    import plotly.offline

    from gpufeed import __version__

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("gpufeed.present", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.policies["json.dumps_function"] = strict_json  # chart data: null, never NaN
    meta = run.meta
    t0, t1 = analysis.span
    if not math.isfinite(t0):
        t0, t1 = 0.0, 0.0
    charts, figures, missing = html_charts.charts(analysis.charts, meta.get("gpu_unavailable"))
    columns, rows = percentile_rows(analysis)
    gpus = meta.get("gpus") or []
    command = meta.get("command") or []  # redacted when loaded (`analysis.run.load`)
    command = shlex.join(command) if isinstance(command, list) else str(command)
    plotly_js = plotly.offline.get_plotlyjs()
    page = env.get_template("report.html").render(
        name=str(meta.get("name") or Path(str(run.path)).name),
        command=command,
        hosts=", ".join(str(h) for h in meta.get("hosts") or []) or "unknown host",
        started=clock_text(t0),
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
        summary=summary_cards(run, analysis, t0, t1),
        step_phases=step_phase_rows(analysis),
        findings=[f.to_dict() for f in analysis.findings],
        checks=analysis.checks,
        healthy=healthy_text(analysis),
        charts=charts,
        missing=missing,
        percentile_columns=columns,
        percentiles=rows,
        version=__version__,
        downsample_note=f"charts binned to at most {analysis.charts.points} points per series",
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
