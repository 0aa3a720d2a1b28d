"""Chrome trace JSON (opens in Perfetto and chrome://tracing): per-rank step spans split into their
phases, evaluation passes on their own track, system counters.

Layout: one trace process per host; in it one thread per rank with "step N" spans and, nested in each,
"data wait" at its start and "forward", "backward", "optimizer" laid end to end against its end (the
recorder keeps each phase's duration, not its start; the gap left is "other"); data wait is left out
and marked "unknown" where it was not measured. Evaluation passes get a thread of their own per rank
("rank N evaluation"). Counter tracks for every system metric (one series per device) and for
CPU by process role. Times are microseconds (ns precision) from the run's start (or the window's):
otherData.time_origin_unix_s. `present.kineto` adds these tracks to a torch.profiler trace.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from gpufeed.analysis.schema import unit
from gpufeed.errors import GpufeedError

if TYPE_CHECKING:
    from gpufeed.analysis.run import Run
    from gpufeed.analysis.timeline import Window

MAX_MB = 200.0
# measured 96-100 bytes an event (2026-11-25), rounded up; the written text is checked too
_BYTES_PER_EVENT = 110
_EVAL_TID = 10_000  # evaluation threads sort after every rank's training thread


class TraceError(GpufeedError, ValueError):
    """The trace cannot be written as asked (too large, empty window); the message says what to do."""


def render_trace(
    run: Run,
    part: Window,
    max_mb: float = MAX_MB,
    kineto: dict[str, Any] | None = None,
) -> tuple[str, int]:
    """The trace of `part` of `run` (`analysis.timeline.window`) as JSON text and its event
    count; with `kineto` (a torch.profiler trace, already read and windowed), gpufeed's tracks
    added to it. Raises TraceError past `max_mb`."""
    from gpufeed.present.html import strict_json
    from gpufeed.present.kineto import merge_into

    trace = build_trace(run, part, max_mb=max_mb)
    if kineto is not None:
        trace = merge_into(kineto, trace)
    text = strict_json(trace, separators=(",", ":"))  # NaN (e.g. in a Kineto trace's args): null
    if len(text) > max_mb * 1e6:
        info = trace.get("otherData", trace.get("gpufeed"))
        raise TraceError(_too_big(run, len(text) / 1e6, max_mb, info))
    return text, len(trace["traceEvents"])


def build_trace(run: Run, part: Window, max_mb: float = MAX_MB) -> dict[str, Any]:
    """The trace as a dict ({"traceEvents": [...], ...}) of the samples, steps and evaluation
    passes in `part` of `run`; raises TraceError past `max_mb` (estimated)."""
    t0, t1, lo, hi = part.t0, part.t1, part.lo, part.hi
    steps, evals, system, procs = part.steps, part.evals, part.system, part.processes
    info = {
        "run": str(run.path),
        "name": run.meta.get("name"),
        "window_start_s": round(lo - t0, 3),
        "window_end_s": round(hi - t0, 3),
        "run_seconds": round(t1 - t0, 3),
        "time_origin_unix_s": lo,
        "training_steps_s": round(part.training_steps_s, 3),
        "evaluation_s": round(part.evaluation_s, 3),
        "evaluation_passes": len(evals),
    }
    estimate = (
        len(evals)
        + (
            5 * len(steps)
            + int(system.groupby(["host", "metric"], observed=True)["time"].nunique().sum())
        )
        + int(procs.groupby("host", observed=True)["time"].nunique().sum())
    )
    if estimate * _BYTES_PER_EVENT > max_mb * 1e6:
        raise TraceError(_too_big(run, estimate * _BYTES_PER_EVENT / 1e6, max_mb, info))

    hosts = sorted(
        {str(h) for h in [*steps["host"], *evals["host"], *system["host"], *procs["host"]]}
    )
    pid_of = {h: i + 1 for i, h in enumerate(hosts)}
    events: list[dict[str, Any]] = []
    for host, pid in pid_of.items():
        events.append(_meta(pid, 0, "process_name", host))
        events.append(
            {
                "ph": "M",
                "pid": pid,
                "tid": 0,
                "name": "process_sort_index",
                "args": {"sort_index": pid},
            }
        )

    def us(t: Any) -> Any:
        return np.round((np.asarray(t, dtype=float) - lo) * 1e6, 3)

    for (host, rank), g in steps.groupby(["host", "rank"], sort=True):
        pid, tid = pid_of[str(host)], int(rank) + 1
        events += _thread(pid, tid, f"rank {int(rank)} (pid {int(g['pid'].iloc[0])})")
        # Ends are rounded like starts and durations derived from them, so that a step's span never
        # reaches into the next one's (rounding ts and dur separately can overlap them by 0.1 µs).
        ts, ends = us(g["start"]), us(g["end"])
        dur = np.round(ends - ts, 3)
        wait = np.round(g["data_wait"].to_numpy(dtype=float) * 1e6, 3)
        parts = {
            p: np.round(g[p].to_numpy(dtype=float) * 1e6, 3) if p in g else np.full(len(g), np.nan)
            for p in ("forward", "backward", "optimizer")
        }
        samples = g["samples"].to_numpy(dtype=float)
        thread = {  # the training thread during each wait: on a CPU, ready for one
            k: g[f"data_wait_{k}"].to_numpy(dtype=float) if f"data_wait_{k}" in g else wait * np.nan
            for k in ("cpu", "ready")
        }
        for i, step in enumerate(g["step"].to_numpy()):
            args: dict[str, Any] = {
                "step": int(step),
                "data_wait_ms": round(wait[i] / 1e3, 3) if math.isfinite(wait[i]) else "unknown",
            }
            for p, v in parts.items():
                if math.isfinite(v[i]):
                    args[f"{p}_ms"] = round(v[i] / 1e3, 3)
            if math.isfinite(samples[i]):
                args["samples"] = int(samples[i])
            events.append(_span(f"step {int(step)}", "step", ts[i], dur[i], pid, tid, args))
            if math.isfinite(wait[i]) and wait[i] > 0:
                # the training thread meanwhile: loading itself, or asleep on workers
                cpu = {
                    f"{k}_ms": round(v[i] * 1e3, 3)
                    for k, v in thread.items()
                    if math.isfinite(v[i])
                }
                events.append(
                    _span("data wait", "data", ts[i], min(wait[i], dur[i]), pid, tid, cpu or None)
                )
            # The hooks keep durations only: lay the model's phases back from the step's end (the
            # end of its optimizer step), never before the data wait.
            floor = ts[i] + (min(wait[i], dur[i]) if math.isfinite(wait[i]) else 0.0)
            at = ends[i]
            for p in ("optimizer", "backward", "forward"):
                length = parts[p][i]
                if not math.isfinite(length) or length <= 0:
                    continue
                begin = max(floor, np.round(at - length, 3))
                if at > begin:
                    events.append(_span(p, "phase", begin, np.round(at - begin, 3), pid, tid))
                at = begin

    for (host, rank), g in evals.groupby(["host", "rank"], sort=True):
        pid, tid = pid_of[str(host)], _EVAL_TID + int(rank)
        events += _thread(pid, tid, f"rank {int(rank)} evaluation")
        ts, ends = us(g["start"]), us(g["end"])
        for i, row in enumerate(g.itertuples()):
            args = {"batches": _int_or_none(row.batches), "samples": _int_or_none(row.samples)}
            if math.isfinite(float(row.data_wait)):
                args["data_wait_ms"] = round(float(row.data_wait) * 1e3, 3)
            events.append(
                _span(
                    "evaluation", "evaluation", ts[i], np.round(ends[i] - ts[i], 3), pid, tid, args
                )
            )

    for (host, metric), g in system.groupby(["host", "metric"], sort=True):
        shown = unit(str(metric))  # the unit every presenter shows it in (analysis.schema)
        scale = 1.0 / shown.divisor
        name = f"{metric} ({shown.shown})" if shown.shown else str(metric)
        wide = g.pivot_table(index="time", columns="device", values="value", aggfunc="mean")
        labels = [str(d) or "value" for d in wide.columns]
        values = wide.to_numpy(dtype=float) * scale
        for t, row in zip(us(wide.index.to_numpy()), values, strict=True):
            args = {
                k: round(float(v), 3) for k, v in zip(labels, row, strict=True) if math.isfinite(v)
            }
            events.append(
                {"name": name, "ph": "C", "ts": t, "pid": pid_of[str(host)], "args": args}
            )

    for host, g in procs.groupby("host", sort=True):
        wide = g.pivot_table(
            index="time", columns="role", values="cpu", aggfunc="sum", fill_value=0.0
        )
        for t, row in zip(us(wide.index.to_numpy()), wide.to_numpy(dtype=float) / 100, strict=True):
            args = {str(r): round(float(v), 3) for r, v in zip(wide.columns, row, strict=True)}
            events.append(
                {
                    "name": "CPU by role (cores)",
                    "ph": "C",
                    "ts": t,
                    "pid": pid_of[str(host)],
                    "args": args,
                }
            )

    for e in events:  # numpy scalars -> Python numbers for json
        for key in ("ts", "dur"):
            if key in e:
                e[key] = float(e[key])
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": info}


def _thread(pid: int, tid: int, name: str) -> list[dict[str, Any]]:
    """A track's name and its place (tracks sort by tid)."""
    sort = {"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index"}
    return [_meta(pid, tid, "thread_name", name), {**sort, "args": {"sort_index": tid}}]


def _span(
    name: str, cat: str, ts: Any, dur: Any, pid: int, tid: int, args: dict[str, Any] | None = None
) -> dict[str, Any]:
    event = {"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": dur, "pid": pid, "tid": tid}
    if args is not None:
        event["args"] = args
    return event


def _int_or_none(value: Any) -> int | None:
    v = float(value)
    return int(v) if math.isfinite(v) else None


def _meta(pid: int, tid: int, kind: str, name: str) -> dict[str, Any]:
    return {"ph": "M", "pid": pid, "tid": tid, "name": kind, "args": {"name": name}}


def _too_big(run: Run, mb: float, max_mb: float, info: dict[str, Any]) -> str:
    span = info["window_end_s"] - info["window_start_s"]
    fits = max(1.0, span * max_mb / mb * 0.9)
    a = info["window_start_s"]
    return (
        f"the trace of {run.path} would be about {mb:,.3g} MB, over the {max_mb:g} MB cap that Perfetto "
        f"and chrome://tracing load comfortably. Pick a window of about {fits:,.0f} s with "
        f"--start/--end (seconds from the run's start; the run spans 0-{info['run_seconds']:,.0f} s), "
        f"e.g. --start {a:g} --end {a + fits:.0f}, or raise --max-mb."
    )
