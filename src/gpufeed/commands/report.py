"""`gpufeed report`: load a run, analyze it, render the HTML report (and JSON findings) and write
them; with `--watch`, again every few seconds until the run finishes."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from gpufeed.atomic import write_atomic

if TYPE_CHECKING:
    from gpufeed.analysis.finding import Finding


def write_report(
    run_path: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    out: str | os.PathLike[str] | None = None,
    json_out: str | os.PathLike[str] | None = None,
    config: str | os.PathLike[str] | None = None,
    sets: Iterable[str] = (),
    watch: float | None = None,
    echo: Callable[[str], None] = print,
    on_findings: Callable[[list[Finding]], None] | None = None,
) -> Path:
    """Analyze a run directory and write the report (default RUN/report.html), optionally the findings as
    JSON; thresholds from `config` (or ./gpufeed.toml) and `sets` ("RULE.param=value"); with `watch`,
    rewrite both every `watch` seconds until the run finishes or Ctrl-C. `on_findings` gets the
    findings of the last rewrite (e.g. to print them in the terminal)."""
    from gpufeed.analysis.combine import run_paths
    from gpufeed.analysis.config import resolve
    from gpufeed.analysis.rules import run_rules
    from gpufeed.analysis.run import load
    from gpufeed.present.html import findings_json, render_html, rule_checks

    overrides = resolve(config, sets)
    target = Path(out) if out is not None else run_paths(run_path)[0] / "report.html"
    while True:
        run = load(run_path)
        findings = run_rules(run, **overrides)
        page = render_html(run, findings, checks=rule_checks(findings, overrides))
        write_atomic(target, page, make_parents=True)
        if json_out is not None:
            write_atomic(json_out, findings_json(run, findings), make_parents=True)
        done = bool(run.meta.get("finished"))
        stamp = datetime.now().strftime("%H:%M:%S")
        echo(
            f"gpufeed: report written to {target}"
            + (f" and findings to {json_out}" if json_out is not None else "")
            + (f" ({stamp}, run still in progress)" if watch and not done else "")
        )
        if not watch or done:
            break
        try:
            time.sleep(watch)
        except KeyboardInterrupt:
            break
    if on_findings is not None:
        on_findings(findings)
    return target
