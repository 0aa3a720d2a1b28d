"""Terminal output with rich: a run's summary (`gpufeed show RUN`), `gpufeed ls` (runs in a folder)
and findings (severity, title, evidence, recommendation)."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from gpufeed.analysis.schema import UNITS, unit
from gpufeed.present.numbers import (
    after_warmup,
    ceiling_text,
    count,
    cpu_counts,
    damaged_text,
    finite,
    number,
)
from gpufeed.text import visible

if TYPE_CHECKING:
    import pandas as pd

    from gpufeed.analysis.finding import Finding
    from gpufeed.analysis.result import Analysis
    from gpufeed.analysis.run import Run


def print_run(run: Run, analysis: Analysis, console: Console | None = None) -> None:
    """Print a run's summary: what ran, phases, step throughput, a percentile table per metric, and
    the findings, all as `analysis.result.analyze_run` found them (the data-wait share after
    warm-up beside the table's all-steps share; the job's own ceiling, where measured)."""
    from gpufeed.analysis.stats import PHASES  # pandas: imported when a run is shown

    steady, ceiling = analysis.steady, analysis.ceiling

    console = console or Console()
    meta = run.meta
    # Everything from the run (paths, argv, host and GPU names, store strings) is shown as text,
    # never as markup: `_m` escapes it for markup and `_text` wraps it for table cells.
    parts = meta.get("parts") or [run.path]
    console.print(f"[bold]gpufeed run[/bold] {_m(' + '.join(map(str, parts)))}", emoji=False)
    # key / value rows: a long value (a command line) wraps under itself, not under the key
    head = Table.grid(padding=(0, 3, 0, 0))
    head.add_column(no_wrap=True)
    head.add_column(overflow="fold")
    head.add_row("command", _text(_command_line(meta) or "?"))
    gpus = ", ".join(_gpu_name(g) for g in meta.get("gpus") or []) or "none"
    hosts = ", ".join(map(str, meta.get("hosts") or [])) or "?"
    head.add_row(
        "hosts",
        _text(f"{hosts} · {cpu_counts(meta)} CPUs ({meta.get('cpu_model', '?')}) · GPUs: {gpus}"),
    )
    if meta.get("gpu_unavailable"):
        head.add_row("", _text(meta["gpu_unavailable"], "dim"))
    status = (
        _text(f"exit code {meta.get('exit_code')}")
        if meta.get("finished")
        else _text(meta.get("not_finished", "not finished"), "yellow")
    )
    head.add_row("status", status)
    if meta.get("dropped_events"):
        head.add_row("", _text(f"{meta['dropped_events']} profiler events were dropped", "yellow"))
    if meta.get("damaged_stores"):
        head.add_row("", _text(damaged_text(meta["damaged_stores"]), "yellow"))
    for note in meta.get("partial_recording") or []:  # several training threads, a forked trainer
        if isinstance(note, dict) and note.get("message"):
            head.add_row("", _text(note["message"], "yellow"))
    console.print(Padding(head, (0, 0, 0, 2), expand=False))

    ph = analysis.phases
    table = Table(title="Phases", title_justify="left")
    for col in ("phase", "duration", "share"):
        table.add_column(col, justify="left" if col == "phase" else "right")
    total = float(ph["duration"].sum())
    for row in ph.itertuples():
        share = row.duration / total if total > 0 else math.nan
        table.add_row(row.phase, _seconds(row.duration), _percent(share))
    table.add_row("[bold]total[/bold]", _seconds(total), "")
    console.print(table)

    s = analysis.summary
    if s["steps"] == 0:
        console.print(f"[yellow]No training steps were recorded[/yellow]: {_m(analysis.no_steps)}.")
    else:
        caption = "data wait: its share of step time (a step includes its wait) over every step"
        if (judged := after_warmup(steady, s["ranks"])) and math.isfinite(s["data_wait_share"]):
            caption += f", warm-up included; {judged} (see `gpufeed rules`)"
        table = Table(
            title="Training steps", title_justify="left", caption=caption, caption_justify="left"
        )
        for col in ("steps", "ranks", "steps/s", "samples/s", "step p50", "step p95", "data wait"):
            table.add_column(col, justify="right", no_wrap=True)
        table.add_row(
            str(s["steps"]),
            str(s["ranks"]),
            number(s["steps_per_s"], 2),
            number(s["samples_per_s"], 1),
            _seconds(s["step_p50"]),
            _seconds(s["step_p95"]),
            _percent(s["data_wait_share"]) if math.isfinite(s["data_wait_share"]) else "unknown",
        )
        console.print(table)
        if math.isfinite(s["forward_share"]):
            clock = "GPU time from CUDA events" if s["phase_clock"] == "cuda" else "host time"
            shares = " · ".join(
                f"{p.replace('_', ' ')} {_percent(s[f'{p}_share'])}"
                if math.isfinite(s[f"{p}_share"])
                else f"{p.replace('_', ' ')} unknown"
                for p in PHASES
            )
            console.print(f"Step phases ({clock}): {shares}")
        note = analysis.wait_note
        if note:
            console.print(f"Data wait: {note}")
        if own := ceiling_text(ceiling, meta):
            console.print(f"Own ceiling: {_m(own)}")
        if s["eval_passes"]:
            console.print(
                f"Evaluation: {count(s['eval_passes'], 'pass')}, {_seconds(s['eval_time'])} "
                "(not counted in the training steps above)"
            )

    if analysis.process_roles:
        _print_processes(analysis.process_roles, console)

    _print_metrics(analysis.percentiles, console)
    print_findings(analysis.findings, console)


def _print_metrics(pt: pd.DataFrame, console: Console) -> None:
    """Percentiles of every system metric (`pt`), one row per metric and device."""
    from gpufeed.analysis.stats import PERCENTILES

    if len(pt) == 0:
        console.print("[yellow]No system samples were recorded.[/yellow]")
        return
    table = Table(title="System metrics", title_justify="left")
    table.add_column("metric")
    table.add_column("device")
    table.add_column("unit")
    for name, _ in PERCENTILES:
        table.add_column(name, justify="right")
    for (metric, device), row in pt.iterrows():
        shown = unit(str(metric))  # the schema's display unit: GiB, MB/s, %, W, MHz
        values = [number(row[name] / shown.divisor, shown.decimals) for name, _ in PERCENTILES]
        table.add_row(_text(metric), _text(device or ""), shown.shown, *values)
    console.print(table)


def _print_processes(roles: list[dict[str, Any]], console: Console) -> None:
    """Per role: how many processes, their CPU (% of one core, summed over processes and hosts) and
    peak memory (`Analysis.process_roles`)."""
    memory = UNITS["bytes"]
    table = Table(title="Processes", title_justify="left")
    for col in ("role", "processes", "CPU p50", "CPU p95", "peak RSS"):
        table.add_column(col, justify="left" if col == "role" else "right")
    for row in roles:
        table.add_row(
            _text(row["role"]),
            str(row["processes"]),
            number(row["cpu_p50"], 0) + "%",
            number(row["cpu_p95"], 0) + "%",
            number(row["peak_rss"] / memory.divisor, memory.decimals) + f" {memory.shown}",
        )
    console.print(table)


def print_findings(
    findings: list[Finding] | list[dict[str, Any]],
    console: Console | None = None,
    title: str = "Findings",
) -> None:
    """Each finding: severity, title, expected speedup, its evidence numbers and the action."""
    (console or Console()).print(findings_view(findings, title), crop=False)


def findings_view(findings: list[Finding] | list[dict[str, Any]], title: str = "Findings") -> Group:
    """What `print_findings` prints, as one renderable (for results that print themselves). Print
    it with `crop=False`: evidence and actions stay one line each, for the terminal to wrap."""

    def line(markup: str, soft_wrap: bool = False) -> Text:
        text = Text.from_markup(markup, emoji=False)
        if soft_wrap:  # one long line the terminal wraps, as console.print(soft_wrap=True)
            text.no_wrap, text.overflow = True, "ignore"
        return text

    lines = [line(f"\n[bold]{_m(title)}[/]")]
    if not findings:
        lines.append(line("  no bottleneck found"))
    colors = {"critical": "red", "warning": "yellow", "info": "blue"}
    for f in findings:
        d = f if isinstance(f, dict) else f.to_dict()
        color = colors.get(d["severity"], "white")
        speed = f" (expected speedup ×{d['est_speedup']:.2f})" if d.get("est_speedup") else ""
        # Titles, evidence and recommendations can embed run strings (hosts, argv, paths).
        head = f"[{color}]{_m(str(d['severity']).upper())}[/] [bold]{_m(d['title'], True)}[/]"
        lines.append(line(head + speed))
        ev = ", ".join(f"{k}={v}" for k, v in d["evidence"].items())
        lines.append(line(f"    evidence: {_m(ev)}", soft_wrap=True))
        lines.append(line(f"    → {_m(d['recommendation'], True)}", soft_wrap=True))
    return Group(*lines)


PROBLEM = "__problem__"  # a key `gpufeed ls` sets in a run's meta dict: why it has no metadata


def print_runs(
    base: Path, metas: dict[Path, dict[str, Any]], console: Console | None = None
) -> None:
    """Print run directories (`gpufeed ls`) in the order given, each with its meta.json dict."""
    console = console or Console()
    if not metas:
        console.print(
            f"No runs under {_m(base)}/ (create one with `gpufeed profile -- COMMAND`).",
            emoji=False,
        )
        return
    rows = []
    for run_dir, meta in metas.items():
        start, end = finite(meta.get("start_time")), finite(meta.get("end_time"))
        code = meta.get("exit_code")
        duration = _seconds(end - start) if start and end else None
        state = meta.get(PROBLEM) or "unfinished"
        rows.append(
            (
                _text(run_dir.name),
                Text(_clock(start, seconds=False)),  # the run's name has the seconds
                Text(duration) if duration else Text(state, style="yellow"),
                Text("" if code is None else str(code)),
                _text(visible(_command_line(meta))),
            )
        )
    heads = ("run", "started", "duration", "exit")
    # every column but the command keeps its whole width (a run's name is copied into `show`);
    # the command gets what is left of the line, or is left out where nothing is
    widths = [max(len(h), *(r[i].cell_len for r in rows)) for i, h in enumerate(heads)]
    room = console.width - sum(w + 3 for w in widths) - 4  # 3: padding and rule per column
    table = Table(title=_text(f"Runs in {base}"), title_justify="left")
    for head, width in zip(heads, widths, strict=True):
        right = head in ("duration", "exit")
        table.add_column(head, justify="right" if right else "left", no_wrap=True, min_width=width)
    command = room >= len("command")
    if command:
        table.add_column("command", overflow="ellipsis", no_wrap=True, max_width=room)
    for row in rows:
        table.add_row(*(row if command else row[:-1]))
    console.print(table)


def _command_line(meta: dict[str, Any]) -> str:
    """The run's command as one line (redacted when read: `analysis.run.redact_meta`)."""
    command = meta.get("command") or []
    if isinstance(command, list):
        return " ".join(str(c) for c in command)
    return str(command)


def _m(value: Any, keep_newlines: bool = False) -> str:
    """A string from a run, safe to put into Rich markup: escaped, control characters visible."""
    return escape(visible(value, keep_newlines))


def _text(value: Any, style: str = "") -> Text:
    """A string from a run as a table cell: plain text (no markup, no emoji codes)."""
    return Text(visible(value), style=style)


def _gpu_name(gpu: Any) -> str:
    return str(gpu.get("name", "?")) if isinstance(gpu, dict) else str(gpu)


def _clock(epoch: float | None, seconds: bool = True) -> str:
    fmt = "%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M"
    try:
        return time.strftime(fmt, time.localtime(epoch)) if epoch else "?"
    except (OverflowError, OSError, ValueError):
        return "?"


def _percent(share: float) -> str:
    return "–" if share is None or not math.isfinite(share) else f"{100 * share:.1f}%"


def _seconds(value: float) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    if value < 1:
        return f"{value * 1000:.1f} ms"
    if value < 120:
        return f"{value:.2f} s"
    return f"{value / 60:.1f} min"
