"""Facts about the hosts' CPUs: their cores (meta, per-core series, container limits) and how
busy the run and other processes keep them."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from collections.abc import Callable


def positive(value: Any) -> int | None:
    """A core count read from meta.json: `value` where it is a positive whole number, else None."""
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return value if ok else None


def cpu_count(meta: dict[str, Any], system: pd.DataFrame) -> int:
    """Logical cores of the host (meta, else the number of per-core series in `system`)."""
    n = positive(meta.get("cpu_count"))
    if n:
        return n
    cores = system[system["metric"] == "cpu.core"]["device"].nunique()
    return int(cores) or 1


def cores_of(meta: dict[str, Any], host: str, default: int) -> int:
    """Logical cores of `host` (a combined run names each host's in `host_cpu_counts`), else
    `default`."""
    counts = meta.get("host_cpu_counts")
    return positive(counts.get(str(host)) if isinstance(counts, dict) else None) or default


def per_core_series(rows: pd.DataFrame) -> dict[str, int]:
    """{host: its per-core series} in the cpu.core `rows`."""
    per_core = rows.groupby("host")["device"].nunique()
    return {str(h): int(n) for h, n in per_core.items()}


def host_util(
    rows: pd.DataFrame,
    cores_of: Callable[[str], int],
    sampled_cores: Callable[[str], int],
    role_cores: dict[str, dict[str, float]],
) -> dict[str, np.ndarray]:
    """{host: its whole-host CPU busy % samples (the cpu.util `rows`), of its `cores_of`}. Under a
    container's CPU limit the sampler averages over more cores (`sampled_cores`): the limit's
    cores are busy as far as the run's own processes use them (`role_cores`), or as far as the
    host has fewer idle cores than the limit (other tenants do not use the run's quota)."""
    out: dict[str, np.ndarray] = {}
    for h, g in rows.groupby("host", sort=True):
        host = str(h)
        util = g["value"].to_numpy(dtype=float)
        cores, over = cores_of(host), sampled_cores(host)
        if over > cores:
            ours = sum(role_cores.get(host, {}).values())
            idle = over * (1 - util / 100)
            util = 100 * np.maximum(ours, cores - idle) / cores
        out[host] = np.clip(util, 0.0, 100.0)
    return out


def busy_cores(ours: float, util: float, cores: int) -> float:
    """Cores of a host kept busy: its median whole-host CPU `util` % of `cores`, or what the run's
    own processes there use (`ours`) where that is more (the two are sampled apart)."""
    return max(ours, util / 100 * cores) if np.isfinite(util) else ours


def workers_cpu_bound(one: float, together: float, cores: int, full: bool, busy: float) -> bool:
    """True when loader workers are limited by CPU: one at `busy` % of a core, or, while their
    host is `full` (starved, so each gets less than it wants), at half that or all of them
    together (`together` cores) keeping half its `cores` busy."""
    if not math.isfinite(one):
        return False
    if one >= busy:
        return True
    if not full:
        return False
    return one >= busy / 2 or together >= cores / 2
