"""Facts about the run's processes: the cores each role keeps busy, the loader workers per
training process and their CPU, the training processes' CPU, and the worker counts to advise."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from gpufeed.analysis.rules.shared import BUSY

if TYPE_CHECKING:
    from collections.abc import Callable

PROCESS_COLUMNS = ["time", "host", "pid", "role", "cpu", "rss"]


def role_cores(processes: pd.DataFrame) -> dict[str, dict[str, float]]:
    """{host: {role: mean number of cores the role keeps busy there}} (its processes' CPU summed
    per sample time, / 100). Per host: the hosts of a combined run sample at their own times,
    and each has its own cores."""
    out: dict[str, dict[str, float]] = {}
    for host, p in processes.groupby("host", sort=True):
        per_time = p.groupby(["time", "role"])["cpu"].sum().unstack(fill_value=0.0) / 100.0
        out[str(host)] = {str(role): float(v) for role, v in per_time.mean().items()}
    return out


def worker_count(
    meta: dict[str, Any], processes: pd.DataFrame, rank_hosts: dict[str, int]
) -> float:
    """Loader workers per training process: what its DataLoader hooks saw feeding training
    steps (workers living under a second escape process sampling), else the workers alive at
    a typical sample time of each host (hosts sample at their own times), per training
    process there (`rank_hosts`)."""
    hooked = [r.get("loader_workers") for r in meta.get("ranks") or []]
    hooked = [int(n) for n in hooked if n is not None]
    if hooked:
        return float(np.mean(hooked))
    p = processes
    if len(p) == 0:
        return 0.0
    counts, mains = [], []
    for host, on in p.groupby("host", sort=True):
        workers = on[on["role"] == "worker"].groupby("time")["pid"].nunique()
        per_time = workers.reindex(on["time"].unique(), fill_value=0)
        n = rank_hosts.get(str(host)) or int(on[on["role"] == "main"]["pid"].nunique())
        counts.append(float(np.median(per_time.to_numpy())))
        mains.append(max(1, n))
    return sum(counts) / sum(mains)


def worker_cpu_on(
    processes: pd.DataFrame,
    host: str | None,
    role_cores: dict[str, dict[str, float]],
    rank_hosts: dict[str, int],
    worker_count: float,
) -> float:
    """Mean CPU of one worker of the loaders that feed training (on `host`; None: on every
    host), % of a core: all workers' CPU summed per sample time, shared by `worker_count` per
    training process. So the idle workers of another loader (a persistent validation one)
    do not dilute it. NaN without workers."""
    p = processes
    workers = p[(p["role"] == "worker") & ((p["host"] == host) if host else True)]
    if len(workers) == 0:
        return float("nan")
    hosts = [host] if host else list(role_cores)
    ranks = sum(rank_hosts.get(h, 0) for h in hosts)
    if not ranks:  # no judged steps: the workers seen, each as itself
        return float(workers["cpu"].mean())
    feeding = worker_count * ranks
    if feeding < 0.5:
        return float("nan")
    return 100.0 * sum(role_cores.get(h, {}).get("worker", 0.0) for h in hosts) / feeding


def main_cpu(processes: pd.DataFrame, host: str | None = None) -> float:
    """Mean CPU of one training process (on `host`; None: on any host), % of a core (NaN
    without samples)."""
    m = processes[processes["role"] == "main"]
    if host is not None:
        m = m[m["host"] == host]
    if len(m) == 0:
        return float("nan")
    return float(m.groupby(["host", "pid"])["cpu"].mean().mean())


def workers_needed(most_waiting: pd.DataFrame, worker_count: float) -> int:
    """Loader workers per training process that would end the data wait of the steps
    `most_waiting`: the workers now scaled by step / compute, at least one more; with none
    (the training process loads every batch in ~wait s), wait / compute + 1, at least 2."""
    s = most_waiting
    step, wait = float(s["duration"].mean()), float(s["data_wait"].mean())
    compute = max(step - wait, 1e-6)
    if worker_count < 0.5:
        return max(2, math.ceil(wait / compute - 1e-9) + 1)
    return max(round(worker_count) + 1, math.ceil(worker_count * step / compute - 1e-9))


def worker_room(
    rank_hosts: dict[str, int],
    worker_count: float,
    worker_cpu_on: Callable[[str], float],
    cores_of: Callable[[str], int],
    free_cores: Callable[[str], float],
) -> tuple[str, int]:
    """(host, workers): the loader workers per training process there are cores for where
    there are fewest. On each host, its cores per training process less the one that process
    needs itself, and no more than the workers now plus the host's `free_cores` shared by its
    training processes; each worker takes a core where workers are CPU-bound now (`BUSY`)
    or not measured, more with threads inside it, and where they also wait on reads the CPU
    they take now (at least a quarter of a core); at least 1. Needs steps."""
    now = round(worker_count)

    def room(host: str) -> int:
        ranks = rank_hosts[host]
        cpu = worker_cpu_on(host)
        each = max(cpu / 100, 1.0 if cpu >= BUSY else 0.25) if math.isfinite(cpu) else 1.0
        most = int((cores_of(host) // ranks - 1) / each)
        return max(1, min(most, now + int(free_cores(host) / ranks / each)))

    host = min(rank_hosts, key=room)
    return host, room(host)


def images(meta: dict[str, Any]) -> bool:
    """False when the training processes' DataLoaders delivered something other than images
    (tokens, features); True when images or not recorded (the advice then assumes images)."""
    kinds = {r.get("batch_kind") for r in meta.get("ranks") or []} - {None}
    return not kinds or "image" in kinds


def loader_seen(meta: dict[str, Any]) -> bool:
    """False when no rank saw a DataLoader feed its steps (neither its workers nor what its
    batches held were recorded): batches from a generator, or a DALI or webdataset pipeline,
    whose workers are unknown. True where the run records no ranks."""
    ranks = meta.get("ranks") or []
    return not ranks or any(
        r.get("loader_workers") is not None or r.get("batch_kind") is not None for r in ranks
    )
