"""`Run`: a run directory as pandas frames (`load`), and what the frames hold.

THE SCHEMA IS A CONTRACT between profile, analyze and present, kept as one table in
`gpufeed.analysis.schema` (every frame's columns, the system metrics and the meta keys, with units
and meanings; `help(gpufeed.load)` prints it). The column lists (`frames`) are derived from it. `load`
adds to every frame with times the column `t` (`schema.RELATIVE_TIME`: seconds since the run
started); frames built by hand may lack it, so code must not require it.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufeed.analysis.combine import combine, run_paths
from gpufeed.analysis.frames import (
    EVAL_COLUMNS,
    PROCESS_COLUMNS,
    STEP_COLUMNS,
    SYSTEM_COLUMNS,
    Run,
    RunError,
    add_relative_time,
    frame,
)
from gpufeed.profiler.redact import redact_argv, redact_value
from gpufeed.profiler.store import read_store

if TYPE_CHECKING:
    from collections.abc import Iterable
    from os import PathLike

    import pandas as pd

_RANK_KEYS = (
    "host",
    "rank",
    "local_rank",
    "world_size",
    "pid",
    "start",
    "end",
    "precision",
    "cuda",
    "loader_workers",
    "batch_kind",
    "headspace",
)


def load(path: str | PathLike[str] | Iterable[str | PathLike[str]]) -> Run:
    """Read every store file of a run directory (also one still written, or killed) into a Run.
    Several directories (a list, or a glob pattern) are read as one run of several hosts."""
    import pandas as pd

    from gpufeed.analysis.headspace import split_replayed
    from gpufeed.profiler.session import read_meta

    paths = run_paths(path)
    if len(paths) > 1:
        return combine([load(p) for p in paths])
    run_dir = paths[0]
    if not run_dir.is_dir():
        raise RunError(
            f"{str(run_dir)!r} is not a directory: pass a run directory printed by `gpufeed profile`"
        )
    try:
        stores = sorted(run_dir.glob("*.db"))
        if not os.access(run_dir, os.R_OK | os.X_OK):
            raise PermissionError(13, "Permission denied", str(run_dir))
        meta = read_meta(run_dir)
    except OSError as e:
        raise RunError(
            f"cannot read run directory {str(run_dir)!r}: {e.strerror or e}; check its permissions"
        ) from None
    except ValueError as e:
        raise RunError(
            f"{run_dir / 'meta.json'} is not valid JSON ({e}): the run's metadata is damaged"
        ) from None
    _check_meta(meta, run_dir / "meta.json")
    redact_meta(meta)
    if not meta and not stores:
        raise RunError(
            f"{str(run_dir)!r} is not a gpufeed run directory (no meta.json, no store files): "
            "pass a directory printed by `gpufeed profile`"
        )

    system: list[tuple] = []
    steps: list[tuple] = []
    processes: list[tuple] = []
    workers: dict[str, set[int]] = {}
    evals: list[tuple] = []
    ranks: list[dict[str, Any]] = []
    hosts: set[str] = set(meta.get("hosts") or [])
    dropped = 0
    damaged: list[tuple[Path, Exception]] = []  # store files left out, and why
    for store in stores:
        try:
            data = read_store(store)
            _check_store(data)
        except Exception as e:  # the others still tell what they recorded
            damaged.append((store, e))
            continue
        info = data["info"]
        host = str(info.get("host") or "")
        if not host:
            continue  # a writer that died before writing who it is: nothing to attribute
        hosts.add(host)
        dropped += int(info.get("dropped_events") or 0)
        if store.name.startswith("system-"):
            system += [(t, host, m, d, v) for t, m, d, v in data["system"]]
            processes += [
                (t, host, pid, role, cpu, rss) for t, pid, role, cpu, rss in data["processes"]
            ]
            for key in ("gpus", "gpu_unavailable"):
                if key in info and key not in meta:
                    meta[key] = info[key]
            meta.setdefault("interval", info.get("interval"))
        else:
            rank, local, pid = info.get("rank", 0), info.get("local_rank", 0), info.get("pid")
            ranks.append({k: info.get(k) for k in _RANK_KEYS})
            phases = {row[0]: row[1:] for row in data["phases"]}
            gpu_phases = {row[0]: row[1:] for row in data["gpu_phases"]}
            wait_cpu = {row[0]: row[1:] for row in data["cpu_phases"]}
            unknown = (None, None, None)
            for step, start, end, wait, samples, gpu in data["steps"]:
                row = (host, rank, local, pid, step, start, end, None, wait, samples, gpu)
                host_clock = phases.get(step, unknown)
                gpu_clock = gpu_phases.get(step, unknown)
                cpu = wait_cpu.get(step, (None, None))
                steps.append((*row, *host_clock, None, *gpu_clock, *cpu))
            evals += [(host, rank, pid, a, b, None, n, s, w) for a, b, n, s, w in data["evals"]]
            workers.setdefault(host, set()).update(pid for pid, _ in data["workers"])

    try:
        system_df = pd.DataFrame(system, columns=SYSTEM_COLUMNS).astype(
            {"time": float, "value": float}
        )
        steps_df = frame(steps, STEP_COLUMNS)
        evals_df = frame(evals, EVAL_COLUMNS)
        proc_df = pd.DataFrame(processes, columns=PROCESS_COLUMNS).astype(
            {"cpu": float, "rss": float}
        )
    except (TypeError, ValueError) as e:
        raise RunError(
            f"a store file in {str(run_dir)!r} holds a value that is not a number ({e}): the run "
            "is damaged; profile it again"
        ) from None
    steps_df["duration"] = steps_df["end"] - steps_df["start"]
    known = steps_df[["data_wait", "forward", "backward", "optimizer"]].fillna(0.0).sum(axis=1)
    steps_df["other"] = (steps_df["duration"] - known).where(steps_df["forward"].notna())
    evals_df["duration"] = evals_df["end"] - evals_df["start"]
    evals_df = evals_df.sort_values(["host", "rank", "start"], kind="stable").reset_index(drop=True)
    steps_df = steps_df.sort_values(["host", "rank", "step"], kind="stable").reset_index(drop=True)
    proc_df["role"] = _corrected_roles(proc_df, ranks, workers)
    system_df = system_df.sort_values("time", kind="stable").reset_index(drop=True)
    proc_df = proc_df.sort_values("time", kind="stable").reset_index(drop=True)

    if damaged and len(damaged) == len(stores) and not meta:
        store, e = damaged[0]
        raise RunError(f"cannot read store file {store}: {e}; no file of the run could be read")
    if damaged:
        meta["damaged_stores"] = [f"{store.name} ({e})" for store, e in damaged]
        warnings.warn(
            f"{run_dir}: left out {len(damaged)} store file(s) that cannot be read: "
            f"{'; '.join(meta['damaged_stores'])}; the rest of the run is read",
            RuntimeWarning,
            stacklevel=2,
        )
    meta["hosts"] = sorted(hosts)
    meta["ranks"] = sorted(ranks, key=lambda r: (str(r["host"]), r["rank"] or 0))
    meta["dropped_events"] = dropped + int(meta.get("dropped_events") or 0)
    meta["finished"] = bool(meta.get("end_time"))
    meta.setdefault("gpus", [])
    precisions = {r["precision"] for r in ranks if r["precision"]}
    if precisions:
        meta["precision"] = precisions.pop() if len(precisions) == 1 else "mixed"
    if not meta["finished"]:
        meta["not_finished"] = (
            "the run did not finish cleanly: it is still running or was killed; "
            "data up to the last flush is shown"
        )
    steps_df, replayed = split_replayed(steps_df, meta["ranks"])
    run = Run(run_dir, meta, system_df, steps_df, proc_df, workers, evals_df, replayed)
    return add_relative_time(run)


def redact_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """`meta` with its command redacted in place (and returned): the one pass of a run's metadata
    through today's redaction, when it is read, so that a meta.json written by an older gpufeed
    shows nothing today's redaction hides and no presenter redacts again."""
    command = meta.get("command")
    if isinstance(command, list):
        meta["command"] = redact_argv(str(c) for c in command)
    elif command:
        meta["command"] = redact_value(str(command))
    return meta


_META_TYPES: dict[str, tuple[type, ...]] = {
    "command": (list,),
    "hosts": (list,),
    "gpus": (list,),
    "ranks": (list,),
    "start_time": (int, float, type(None)),
    "end_time": (int, float, type(None)),
    "interval": (int, float, type(None)),
    "dropped_events": (int, type(None)),
    "cpu_count": (int, type(None)),
}


def _check_meta(meta: Any, path: Path) -> None:
    """A RunError naming the key when meta.json is not an object of the documented types."""
    fix = "the run's metadata is damaged; restore meta.json or profile the run again"
    if not isinstance(meta, dict):
        raise RunError(f"{path} holds a JSON {type(meta).__name__}, not an object: {fix}")
    for key, types in _META_TYPES.items():
        value = meta.get(key)
        if key in meta and (isinstance(value, bool) or not isinstance(value, types)):
            want = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise RunError(f"{path}: {key!r} is {value!r}, expected {want}: {fix}")
    if any(not isinstance(h, str) for h in meta.get("hosts") or []):
        raise RunError(f"{path}: 'hosts' must be a list of host names: {fix}")
    if any(not isinstance(g, dict) for g in meta.get("gpus") or []):
        raise RunError(f"{path}: 'gpus' must be a list of objects (index, name, ...): {fix}")
    for key in ("start_time", "end_time"):
        value = meta.get(key)
        if value is not None and not 0 <= value <= LATEST_TIME:
            raise RunError(f"{path}: {key!r} is {value!r}, not a time (epoch seconds): {fix}")


LATEST_TIME = 253_402_300_799  # 9999-12-31 23:59:59 UTC, the last time Python's datetime shows
# a store's info keys and the types they hold where present
_INFO_TYPES: dict[str, tuple[type, ...]] = {
    "rank": (int,),
    "local_rank": (int,),
    "world_size": (int,),
    "pid": (int,),
    "dropped_events": (int, type(None)),
    "start": (int, float, type(None)),
    "end": (int, float, type(None)),
}


def _check_store(data: dict[str, Any]) -> None:
    """A ValueError naming the key when a store's info, or a process sample's pid, is not of the
    type its writer records (a damaged or hand-edited file): the store is then left out."""
    info = data["info"]
    for key, types in _INFO_TYPES.items():
        if key not in info:
            continue
        value = info[key]
        bad = isinstance(value, bool) or not isinstance(value, types)
        if bad or (isinstance(value, float) and not 0 <= value <= LATEST_TIME):
            raise ValueError(f"its info {key!r} is {value!r}, not what gpufeed writes there")
    window = info.get("headspace")
    if window is not None and not (
        isinstance(window, list)
        and [type(v) for v in window] == [int, int]
        and 0 <= window[0] <= window[1]
    ):
        raise ValueError(f"its info 'headspace' is {window!r}, not what gpufeed writes there")
    if any(not isinstance(row[1], int) for row in data.get("processes") or ()):
        raise ValueError("a process sample without a process id")


def _corrected_roles(
    proc: pd.DataFrame, ranks: list[dict[str, Any]], workers: dict[str, set[int]]
) -> Any:
    """The sampler's roles, overridden by what the training processes wrote about themselves."""
    if len(proc) == 0:
        return proc["role"]
    mains = {(str(r["host"]), r["pid"]) for r in ranks}
    exact = {(h, p) for h, pids in workers.items() for p in pids}
    keys = list(zip(proc["host"].astype(str), proc["pid"].astype(int), strict=False))
    return [
        "main" if k in mains else "worker" if k in exact else role
        for k, role in zip(keys, proc["role"], strict=False)
    ]
