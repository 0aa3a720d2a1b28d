"""`gpufeed report`: load a run, analyze it, render the HTML report (and JSON findings) and write
them; with `--watch`, again every few seconds until the run finishes or its recording stops."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from gpufeed.atomic import write_atomic
from gpufeed.output_paths import check_distinct
from gpufeed.processes import alive
from gpufeed.text import visible

if TYPE_CHECKING:
    from gpufeed.analysis.finding import Finding
    from gpufeed.analysis.run import Run

# With a writer that may still be alive, how long nothing new may be recorded before `--watch`
# gives up (the sampler records every interval while its profiler lives; at least 10 intervals).
STALE_S = 60.0


def write_report(
    run_path: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    out: str | os.PathLike[str] | None = None,
    json_out: str | os.PathLike[str] | None = None,
    config: str | os.PathLike[str] | None = None,
    sets: Iterable[str] = (),
    watch: float | None = None,
    echo: Callable[[str], None] = print,
    on_findings: Callable[[list[Finding]], None] | None = None,
    stale_s: float = STALE_S,
) -> Path:
    """Analyze a run directory and write the report (default RUN/report.html), optionally the findings as
    JSON; thresholds from `config` (or ./gpufeed.toml) and `sets` ("RULE.param=value"); with `watch`,
    rewrite both every `watch` seconds until the run finishes, its recording stops (see
    `recording_stopped`; `stale_s`) or Ctrl-C. `on_findings` gets the findings of the last rewrite
    (e.g. to print them in the terminal). Both files are rendered before either is written."""
    from gpufeed.analysis.combine import run_paths
    from gpufeed.analysis.config import resolve
    from gpufeed.analysis.result import analyze_run
    from gpufeed.analysis.run import load
    from gpufeed.present.html import findings_json, render_html

    overrides = resolve(config, sets)
    target = Path(out) if out is not None else run_paths(run_path)[0] / "report.html"
    check_distinct(
        ("--out" if out is not None else "the report (--out)", str(target)), ("--json", json_out)
    )
    while True:
        run = load(run_path)
        analysis = analyze_run(run, overrides)
        findings = analysis.findings
        done = bool(run.meta.get("finished"))
        stopped = None if done else recording_stopped(run, stale_s)
        page = render_html(run, analysis, stopped=stopped)
        data = findings_json(run, findings) if json_out is not None else None
        write_atomic(target, page, make_parents=True)
        if data is not None:
            write_atomic(json_out, data, make_parents=True)  # type: ignore[arg-type]
        stamp = datetime.now().strftime("%H:%M:%S")
        echo(
            f"gpufeed: report written to {visible(target)}"
            + (f" and findings to {visible(json_out)}" if json_out is not None else "")
            + (f" ({stamp}, run still in progress)" if watch and not done and not stopped else "")
        )
        if stopped and watch:
            echo(f"gpufeed: stopped watching: {visible(stopped)}")
        if not watch or done or stopped:
            break
        try:
            time.sleep(watch)
        except KeyboardInterrupt:
            break
    if on_findings is not None:
        on_findings(findings)
    return target


def recording_stopped(run: Run, stale_s: float = STALE_S, now: float | None = None) -> str | None:
    """Why an unfinished run will never finish (its profiler was killed: meta.json never got its
    end), or None while it may still be recording.

    Judged by the newest time recorded in the run (steps, system and process samples; the reader's
    own opening of the stores changes file times, not that): stopped once nothing new came for
    `stale_s` seconds (at least 10 sampling intervals), or for a few intervals where every
    training process the run recorded on this host has exited."""
    from gpufeed.profiler.session import DEFAULT_INTERVAL, FLUSH_INTERVAL, hostname

    now = time.time() if now is None else now
    span, start = run.recorded_span(), run.meta.get("start_time")
    latest = span[1] if span else float(start) if isinstance(start, (int, float)) else now
    idle = now - latest
    interval = run.meta.get("interval")
    interval = float(interval) if isinstance(interval, (int, float)) else DEFAULT_INTERVAL
    here = run.steps[run.steps["host"].astype(str) == hostname()] if len(run.steps) else run.steps
    pids = {int(p) for p in here["pid"]} if len(here) else set()
    if pids and not any(alive(p) for p in pids) and idle > 3 * max(interval, FLUSH_INTERVAL) + 2:
        return (
            f"{run.path} never finished: its training processes (pid "
            f"{', '.join(map(str, sorted(pids)))}) have exited and nothing was recorded for "
            f"{idle:.0f} s, so its profiler was killed; the report shows the run as far as it got"
        )
    if idle > max(stale_s, 10 * interval):
        return (
            f"{run.path} never finished and nothing was recorded for {idle:.0f} s: its profiler "
            "was killed or stopped; the report shows the run as far as it got"
        )
    return None
