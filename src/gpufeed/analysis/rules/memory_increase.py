"""GPUMemoryIncrease: memory keeps growing across the training loop (a leak that ends in OOM)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from gpufeed.analysis.finding import Finding
from gpufeed.analysis.rules.base import Rule
from gpufeed.analysis.rules.context import Context
from gpufeed.analysis.rules.params import Param
from gpufeed.text import MB


class GPUMemoryIncrease(Rule):
    """GPU memory, or the resident memory of a training process, grows steadily.

    Fits a line to each series over the steady state; fires when the fit is good (R^2), the growth is
    large in absolute and relative terms, and projects when memory would run out (the GPU's, or the
    host's for resident memory).
    """

    id = "GPUMemoryIncrease"
    params: ClassVar[dict[str, Param]] = {
        "min_growth_mb": Param(100.0, "growth over the window, MB, below which it is ignored"),
        "min_growth_share": Param(0.1, "growth relative to the starting level"),
        "min_r2": Param(0.8, "R^2 of the linear fit: how steady the growth must be"),
        "min_samples": Param(10, "samples needed in the window"),
    }
    cpu_only = "watches the resident memory (RSS) of the training processes"

    def check(self, ctx: Context, p: dict[str, Any]) -> Iterator[Finding]:
        growing = [f for f in map(_Growth.of, _series(ctx)) if f.steep(p)]
        room = _host_room(ctx, growing)
        for g in growing:
            evidence: dict[str, float | int | str] = {
                "memory": g.label,
                "start_mb": round(g.start / MB, 1),
                "end_mb": round(g.end / MB, 1),
                "growth_mb": round(g.growth / MB, 1),
                "growth_mb_per_min": round(60 * g.slope / MB, 1),
                "r2": round(g.r2, 3),
            }
            until, sharing = float("inf"), ""
            if g.host is None and g.total > g.end:  # a GPU: this series alone fills it
                until = (g.total - g.end) / g.slope
            elif g.host in room:  # several ranks share their host's memory
                free, slope, processes = room[g.host]
                until = free / slope
                evidence["processes_growing_on_host"] = processes
                if processes > 1:
                    sharing = f" with the {processes} training processes growing on its host"
            if until < float("inf"):
                evidence["total_mb"] = round(g.total / MB, 1)
                evidence["minutes_until_full"] = round(until / 60, 1)
            yield Finding(
                rule=self.id,
                severity="critical" if until < 3600 else "warning",
                title=f"{g.label} grows steadily: +{60 * g.slope / MB:.0f} MB/min",
                evidence=evidence,
                recommendation=(
                    f"{g.label} grew {g.growth / MB:.0f} MB during the loop (R^2 {g.r2:.2f})"
                    + (
                        f" and would be full in about {until / 60:.0f} min{sharing}"
                        if until < float("inf")
                        else ""
                    )
                    + _LEAK_FIX
                ),
            )


@dataclass(frozen=True)
class _Growth:
    """A line fitted to one memory series over the steady state."""

    label: str
    host: str | None  # None: a GPU's memory, itself the capacity; else a process on this host
    total: float  # the capacity (the GPU's memory, or the host's)
    samples: int
    slope: float  # bytes per second
    r2: float
    growth: float  # over the window
    start: float
    end: float

    @classmethod
    def of(cls, series: tuple[str, np.ndarray, np.ndarray, float, str | None]) -> _Growth:
        label, t, v, total, host = series
        if len(v) == 0:
            return cls(label, host, total, 0, 0.0, 0.0, 0.0, 0.0, 0.0)
        slope, r2 = _fit(t, v)
        start = float(np.median(v[: max(3, len(v) // 10)]))
        return cls(
            label, host, total, len(v), slope, r2, slope * (t[-1] - t[0]), start, float(v[-1])
        )

    def steep(self, p: dict[str, Any]) -> bool:
        """Whether it grows steadily and by enough to report."""
        return (
            self.samples >= p["min_samples"]
            and self.r2 >= p["min_r2"]
            and self.growth >= p["min_growth_mb"] * MB
            and self.growth >= p["min_growth_share"] * max(self.start, 1.0)
        )


def _host_room(ctx: Context, growing: list[_Growth]) -> dict[str, tuple[float, float, int]]:
    """Per host with growing training processes: (bytes still free, their summed growth per
    second, how many). Several ranks share a host's memory, so it fills at their summed pace;
    free is the host's memory less what it used at the end (or, where that was not recorded,
    less the training processes' last RSS)."""
    system = ctx.run.system
    used = system[system["metric"] == "mem.used"].sort_values("time").groupby("host")["value"]
    last_used = used.last()
    out: dict[str, tuple[float, float, int]] = {}
    for host in sorted({g.host for g in growing if g.host is not None}):
        mine = [g for g in growing if g.host == host]
        total = mine[0].total
        if host in last_used.index:
            free = total - float(last_used[host])
        else:
            procs = ctx.processes
            main = procs[(procs["role"] == "main") & (procs["host"] == host)]
            free = total - float(main.sort_values("time").groupby("pid")["rss"].last().sum())
        if total and free > 0:
            out[host] = (free, sum(g.slope for g in mine), len(mine))
    return out


_LEAK_FIX = (
    ": look for tensors kept across steps (a loss history without .item() or .detach(), growing "
    "lists or caches, tensors stored on self) and release them."
)


def _series(ctx: Context) -> Iterator[tuple[str, np.ndarray, np.ndarray, float, str | None]]:
    """(label, times, values, capacity, host) per GPU (host None: the GPU is the capacity) and
    per training process (its resident memory, against its host's memory). Loader workers are
    not watched: their RSS grows with the pages of a memory-mapped data set they read (page
    cache, not a leak)."""
    if ctx.has_gpu:
        rows = ctx.metric("gpu.mem_used")
        totals = ctx.metric("gpu.mem_total")
        hosts = rows["host"].nunique() > 1
        for (host, device), g in rows.groupby(["host", "device"], sort=True):
            g = g.sort_values("time")
            cap = totals[(totals["host"] == host) & (totals["device"] == device)]["value"]
            yield (
                f"GPU {device} memory" + (f" on {host}" if hosts else ""),
                g["time"].to_numpy(dtype=float),
                g["value"].to_numpy(dtype=float),
                float(cap.max()) if len(cap) else 0.0,
                None,
            )
    system = ctx.run.system
    totals = system[system["metric"] == "mem.total"].groupby("host")["value"].max()
    several = ctx.processes["host"].nunique() > 1
    main = ctx.processes[ctx.processes["role"] == "main"]
    for (host, pid), g in main.groupby(["host", "pid"], sort=True):
        g = g.sort_values("time")
        on = f" on {host}" if several else ""
        yield (
            f"Host memory of training process {pid}{on}",
            g["time"].to_numpy(dtype=float),
            g["rss"].to_numpy(dtype=float),
            float(totals.get(host, 0.0)),
            host,
        )


def _fit(t: np.ndarray, v: np.ndarray) -> tuple[float, float]:
    """Least-squares slope (per second) and R^2 of v over t."""
    t = t - t[0]
    if np.ptp(t) <= 0 or np.ptp(v) <= 0:
        return 0.0, 0.0
    slope, intercept = np.polyfit(t, v, 1)
    resid = v - (slope * t + intercept)
    r2 = 1.0 - float(np.sum(resid**2)) / float(np.sum((v - v.mean()) ** 2))
    return float(slope), r2
