"""gpufeed's tracks (steps, data wait, system counters) added to a torch.profiler (Kineto) trace.

Alignment: Kineto writes ``ts`` in microseconds from ``baseTimeNanoseconds``, a Unix-epoch instant it
takes from the system clock when profiling starts; gpufeed's times are Unix-epoch seconds from the
same system clock. So ``unix_us = ts + baseTimeNanoseconds / 1000`` places both on one axis, with no
guessing, also for traces that hold no event gpufeed also saw (inference, a window of a few ops).
Aligning on a shared event (e.g. Kineto's ``Optimizer.step`` against gpufeed's step ends) would need
such an event and would absorb real delays into the offset; the tests check that the two agree.
Traces of old PyTorch versions without ``baseTimeNanoseconds`` already hold Unix-epoch ``ts``.
"""

from __future__ import annotations

import gzip
import json
import math
import os
from pathlib import Path
from typing import Any

from gpufeed.errors import GpufeedError

# gpufeed's trace processes get pids far from any OS pid Kineto uses (a container's training
# process can be pid 1, which gpufeed's own trace uses for its first host).
PID_BASE = 1_000_000_000
_MARGIN_S = 1.0
# Kineto times are microseconds; anything past the year 9999 (or before 1970) is not a time.
_MAX_UNIX_US = 253_402_300_799e6


class KinetoError(GpufeedError, ValueError):
    """A file that is not a readable Kineto trace, or one outside the run; the message says which."""


def read_kineto(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A torch.profiler Chrome trace (`.json` or `.json.gz`) as a dict."""
    p = Path(path)
    try:
        raw = gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()
        data = json.loads(raw)
    except FileNotFoundError:
        raise KinetoError(f"--merge {p}: no such file; pass a torch.profiler trace") from None
    except (OSError, ValueError) as e:
        raise KinetoError(f"--merge {p} is not a JSON trace ({e}): pass the file written by "
                          "prof.export_chrome_trace() or tensorboard_trace_handler") from None  # fmt: skip
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise KinetoError(
            f"--merge {p} has no traceEvents list: pass a torch.profiler (Kineto) Chrome trace"
        )
    _check_times(p, data)
    return data


def _check_times(path: Path, data: dict[str, Any]) -> None:
    """Raise a KinetoError naming the first field that is not a time in microseconds:
    `baseTimeNanoseconds`, or an event's `ts` or `dur` (finite, within the years 1970-9999)."""
    fix = "pass the file torch.profiler wrote, unedited"
    base = data.get("baseTimeNanoseconds")
    if base is not None and not 0 <= (_number(base) or -1.0) / 1e3 <= _MAX_UNIX_US:
        raise KinetoError(
            f"--merge {path}: baseTimeNanoseconds is {base!r}, not a Unix time in ns: {fix}"
        )
    base_us = _base_us(data)
    for i, e in enumerate(data["traceEvents"]):
        if not isinstance(e, dict):
            continue
        ts, dur = _number(e.get("ts")), _number(e.get("dur"))
        bad = (
            "ts" if "ts" in e and (ts is None or not 0 <= ts + base_us <= _MAX_UNIX_US)
            else "dur" if e.get("dur") is not None and (dur is None or abs(dur) > _MAX_UNIX_US)
            else None
        )  # fmt: skip
        if bad is not None:
            raise KinetoError(
                f"--merge {path}: traceEvents[{i}] ({str(e.get('name'))[:40]!r}) has "
                f"{bad!r}: {e[bad]!r}, not a time in microseconds: {fix}"
            )


def _number(value: Any) -> float | None:
    """`value` as a finite float (a number or a numeric string, as Chrome traces allow), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def kineto_span(kineto: dict[str, Any]) -> tuple[float, float]:
    """(first, last) instant of the Kineto trace's events, in Unix-epoch seconds."""
    base_us = _base_us(kineto)
    spans = [
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur") or 0.0))
        for e in kineto["traceEvents"]
        if isinstance(e, dict) and e.get("ph") in ("X", "B", "E", "i", "C") and "ts" in e
    ]
    if not spans:
        raise KinetoError("the Kineto trace holds no timed events: profile at least one step")
    return (
        (min(a for a, _ in spans) + base_us) / 1e6,
        (max(b for _, b in spans) + base_us) / 1e6,
    )


def merge_window(
    kineto: dict[str, Any], t0: float, t1: float, start: float | None, end: float | None
) -> tuple[float, float]:
    """The window (seconds from the run's start) of gpufeed data to add: the Kineto trace's span
    with a second either side, unless `start`/`end` are given. Raises where the trace is outside
    the run."""
    k0, k1 = kineto_span(kineto)
    if k1 < t0 - _MARGIN_S or k0 > t1 + _MARGIN_S:
        raise KinetoError(
            f"the Kineto trace spans {_clock(k0)}-{_clock(k1)}, outside the run "
            f"({_clock(t0)}-{_clock(t1)}): pass the trace of this run's training"
        )
    lo = start if start is not None else max(0.0, k0 - t0 - _MARGIN_S)
    hi = end if end is not None else k1 - t0 + _MARGIN_S
    return lo, hi


def merge_into(kineto: dict[str, Any], trace: dict[str, Any]) -> dict[str, Any]:
    """`kineto` with gpufeed's `trace` events (from `build_trace`) moved onto Kineto's time axis."""
    origin = float(trace["otherData"]["time_origin_unix_s"])
    shift_us = (origin - _base_us(kineto) / 1e6) * 1e6
    events = []
    for e in trace["traceEvents"]:
        e = {**e, "pid": PID_BASE + int(e["pid"])}
        if e["ph"] == "M" and e["name"] == "process_name":
            e["args"] = {"name": f"gpufeed: {e['args']['name']}"}
        if "ts" in e:
            start = round(float(e["ts"]) + shift_us, 3)
            if "dur" in e:  # derive dur from rounded ends, so no span reaches into the next
                e["dur"] = round(round(float(e["ts"]) + float(e["dur"]) + shift_us, 3) - start, 3)
            e["ts"] = start
        events.append(e)
    merged = {k: v for k, v in kineto.items() if k != "traceEvents"}
    merged["traceEvents"] = [*kineto["traceEvents"], *events]
    merged["gpufeed"] = {**trace["otherData"], "aligned_on": "baseTimeNanoseconds"}
    return merged


def _base_us(kineto: dict[str, Any]) -> float:
    base = _number(kineto.get("baseTimeNanoseconds"))
    return base / 1e3 if base is not None else 0.0


def _clock(epoch: float) -> str:
    import time

    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(epoch)) + " UTC"
    except (OverflowError, OSError, ValueError):  # not a time a calendar holds
        return f"{epoch:g} s Unix time"
