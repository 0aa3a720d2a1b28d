"""`gpufeed trace`: load a run, make its `Timeline` (no rules: `analysis.timeline`), render its
Chrome/Perfetto trace (optionally merged into a torch.profiler trace) and write it."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

from gpufeed.atomic import write_atomic
from gpufeed.present.trace import MAX_MB
from gpufeed.text import visible


def write_trace(
    run_path: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    out: str | os.PathLike[str] | None = None,
    start: float | None = None,
    end: float | None = None,
    max_mb: float = MAX_MB,
    echo: Callable[[str], None] = print,
    merge: str | os.PathLike[str] | None = None,
) -> Path:
    """Write the run's timeline (default RUN/trace.json); `start`/`end` are seconds from the run's
    start. With `merge` (a torch.profiler trace), gpufeed's tracks are added to that trace, over its
    time span (default RUN/trace-merged.json)."""
    from gpufeed.analysis.run import load
    from gpufeed.analysis.timeline import timeline, window
    from gpufeed.present.kineto import KinetoError, merge_window, read_kineto
    from gpufeed.present.trace import TraceError, render_trace

    run = load(run_path)
    line = timeline(run)
    try:
        kineto = read_kineto(merge) if merge is not None else None
        if kineto is not None:
            start, end = merge_window(kineto, *line.span, start, end)
    except KinetoError as e:
        raise TraceError(str(e)) from None
    part = window(run, line, start, end)  # WindowError: a one-line error, as TraceError
    text, events = render_trace(run, part, max_mb=max_mb, kineto=kineto)
    default = "trace-merged.json" if merge is not None else "trace.json"
    target = Path(out) if out is not None else run.path / default
    write_atomic(target, text, make_parents=True)
    echo(
        f"gpufeed: trace written to {visible(target)} ({len(text) / 1e6:.1f} MB, "
        f"{events:,} events): open it in https://ui.perfetto.dev or chrome://tracing"
    )
    return target
