"""Several run directories as one run: a multi-node job leaves one run directory per host.

Frames are concatenated (their ``host`` column already says where each row came from); meta is the
earliest part's, with the times, hosts, ranks, GPUs and counts of all parts. Times are each host's
own clock (epoch seconds), so hosts must keep their clocks in sync (NTP) as distributed training
does anyway. Every frame's relative time `t` counts from the earliest part's start.
"""

from __future__ import annotations

import glob
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufeed.analysis.frames import Run, RunError, add_relative_time

if TYPE_CHECKING:
    from collections.abc import Iterable

_GLOB_CHARS = "*?["


def run_paths(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[Path]:
    """The run directories named by a path, a glob pattern, or a list of either; in order, no repeats."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    out: list[Path] = []
    for item in items:
        text = os.fspath(item)
        if any(c in text for c in _GLOB_CHARS) and not Path(text).exists():
            found = sorted(p for p in glob.glob(text) if Path(p).is_dir())
            if not found:
                raise RunError(f"{text!r} matches no directory: pass run directories or a glob")
            out += [Path(p) for p in found]
        else:
            out.append(Path(text))
    if not out:
        raise RunError("no run directory given: pass one or more run directories")
    unique: dict[Path, Path] = {}
    for path in out:  # one directory given twice (runs/x and /abs/runs/x) is read once
        unique.setdefault(path.resolve(), path)
    return list(unique.values())


def combine(runs: list[Run]) -> Run:
    """One Run from the runs of several hosts; refuses parts that hold the same host's rank twice."""
    import pandas as pd

    if len(runs) == 1:
        return runs[0]
    runs = sorted(runs, key=lambda r: _first(r.meta.get("start_time")))
    seen: dict[tuple[str, Any], Path] = {}
    for run in runs:
        for r in run.meta.get("ranks") or []:
            key = (str(r.get("host")), r.get("rank"))
            if key in seen and seen[key] != run.path:
                raise RunError(
                    f"{run.path} and {seen[key]} both hold rank {key[1]} of host {key[0]!r}: they "
                    "are separate runs, not parts of one; pass one run directory per host"
                )
            seen[key] = run.path
    _refuse_apart_in_time(runs)
    meta = dict(runs[0].meta)
    metas = [r.meta for r in runs]
    starts = [m["start_time"] for m in metas if m.get("start_time")]
    ends = [m["end_time"] for m in metas if m.get("end_time")]
    meta["start_time"] = min(starts) if starts else None
    finished = all(m.get("finished") for m in metas)
    meta["end_time"] = max(ends) if ends and finished else None
    meta["finished"] = finished
    meta.pop("not_finished", None)
    if not finished:
        meta["not_finished"] = next(m["not_finished"] for m in metas if m.get("not_finished"))
    meta["exit_code"] = next(
        (m["exit_code"] for m in metas if m.get("exit_code")), meta.get("exit_code")
    )
    meta["hosts"] = sorted({str(h) for m in metas for h in m.get("hosts") or []})
    meta["ranks"] = sorted(
        (r for m in metas for r in m.get("ranks") or []),
        key=lambda r: (r.get("rank") or 0, str(r.get("host"))),
    )
    meta["gpus"] = [
        {**g, "host": g.get("host", h)}
        for m in metas
        for g, h in zip(m.get("gpus") or [], _repeat_host(m), strict=False)
    ]
    meta["host_cpu_counts"] = {
        str(h): int(m["cpu_count"])
        for m in metas
        if m.get("cpu_count")
        for h in m.get("hosts") or []
    }
    intervals = [m["interval"] for m in metas if isinstance(m.get("interval"), (int, float))]
    meta["interval"] = max(intervals, default=meta.get("interval"))  # the sparsest host's
    meta["dropped_events"] = sum(int(m.get("dropped_events") or 0) for m in metas)
    damaged = [d for r in runs for d in r.meta.get("damaged_stores") or []]
    if damaged:
        meta["damaged_stores"] = damaged
    meta["parts"] = [str(r.path) for r in runs]
    precisions = {m["precision"] for m in metas if m.get("precision")}
    meta.pop("precision", None)
    if precisions:
        meta["precision"] = precisions.pop() if len(precisions) == 1 else "mixed"

    def cat(frames: list[pd.DataFrame], order: list[str]) -> pd.DataFrame:
        df = pd.concat(frames, ignore_index=True) if any(len(f) for f in frames) else frames[0]
        return df.sort_values(order, kind="stable").reset_index(drop=True)

    workers: dict[str, set[int]] = {}
    for run in runs:
        for host, pids in run.workers.items():
            workers.setdefault(host, set()).update(pids)
    run = Run(
        runs[0].path,
        meta,
        cat([r.system for r in runs], ["time"]),
        cat([r.steps for r in runs], ["host", "rank", "step"]),
        cat([r.processes for r in runs], ["time"]),
        workers,
        cat([r.evals for r in runs], ["host", "rank", "start"]),
        cat([r.headspace for r in runs], ["host", "rank", "step"]),
    )
    return add_relative_time(run)  # from the earliest part's start, in every frame


def _refuse_apart_in_time(runs: list[Run]) -> None:
    """Parts of one job run at the same time: two parts from one host (one clock) that do not
    overlap are separate runs, even where neither recorded a rank to tell them apart."""
    spans = [(run, _span(run), {str(h) for h in run.meta.get("hosts") or []}) for run in runs]
    for i, (a, (a0, a1), hosts_a) in enumerate(spans):
        for b, (b0, b1), hosts_b in spans[i + 1 :]:
            shared = sorted(hosts_a & hosts_b)
            if shared and (a1 < b0 or b1 < a0):
                raise RunError(
                    f"{a.path} and {b.path} both come from host {shared[0]!r} but ran at different "
                    "times: they are separate runs, not parts of one; pass one run directory per "
                    "host of the same job"
                )


def _span(run: Run) -> tuple[float, float]:
    """When a part ran (epoch seconds): from meta.json, else from its first and last records."""
    first, last = run.recorded_span() or (-math.inf, math.inf)
    start, end = run.meta.get("start_time"), run.meta.get("end_time")
    start = float(start) if isinstance(start, (int, float)) else first
    end = float(end) if isinstance(end, (int, float)) else last
    return start, max(end, start)


def _first(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and value else float("inf")


def _repeat_host(meta: dict[str, Any]) -> list[str]:
    hosts = meta.get("hosts") or [""]
    return [str(hosts[0])] * len(meta.get("gpus") or [])
