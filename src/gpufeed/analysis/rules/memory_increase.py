"""GPUMemoryIncrease: memory keeps growing across the training loop (a leak that ends in OOM)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np

from gpufeed.analysis.finding import Finding
from gpufeed.analysis.rules.base import Param, Rule
from gpufeed.analysis.rules.context import Context

MB = 1e6


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
        for label, t, v, total in _series(ctx):
            if len(v) < p["min_samples"]:
                continue
            slope, r2 = _fit(t, v)
            growth = slope * (t[-1] - t[0])
            start = float(np.median(v[: max(3, len(v) // 10)]))
            if (
                r2 < p["min_r2"]
                or growth < p["min_growth_mb"] * MB
                or growth < p["min_growth_share"] * max(start, 1.0)
            ):
                continue
            evidence: dict[str, float | int | str] = {
                "memory": label,
                "start_mb": round(start / MB, 1),
                "end_mb": round(float(v[-1]) / MB, 1),
                "growth_mb": round(growth / MB, 1),
                "growth_mb_per_min": round(60 * slope / MB, 1),
                "r2": round(r2, 3),
            }
            until = float("inf")
            if total and total > v[-1]:
                until = (total - float(v[-1])) / slope
                evidence["total_mb"] = round(total / MB, 1)
                evidence["minutes_until_full"] = round(until / 60, 1)
            yield Finding(
                rule=self.id,
                severity="critical" if until < 3600 else "warning",
                title=f"{label} grows steadily: +{60 * slope / MB:.0f} MB/min",
                evidence=evidence,
                recommendation=(
                    f"{label} grew {growth / MB:.0f} MB during the loop (R^2 {r2:.2f})"
                    + (
                        f" and would be full in about {until / 60:.0f} min"
                        if until < float("inf")
                        else ""
                    )
                    + _LEAK_FIX
                ),
            )


_LEAK_FIX = (
    ": look for tensors kept across steps (a loss history without .item() or .detach(), growing "
    "lists or caches, tensors stored on self) and release them."
)


def _series(ctx: Context) -> Iterator[tuple[str, np.ndarray, np.ndarray, float]]:
    """(label, times, values, capacity) per GPU and per training process (its resident memory,
    against its host's memory). Loader workers are not watched: their RSS grows with the pages of
    a memory-mapped data set they read (page cache, not a leak)."""
    if ctx.has_gpu:
        rows = ctx.metric("gpu.mem_used")
        totals = ctx.metric("gpu.mem_total")
        for (host, device), g in rows.groupby(["host", "device"], sort=True):
            g = g.sort_values("time")
            cap = totals[(totals["host"] == host) & (totals["device"] == device)]["value"]
            yield (
                f"GPU {device} memory",
                g["time"].to_numpy(dtype=float),
                g["value"].to_numpy(dtype=float),
                float(cap.max()) if len(cap) else 0.0,
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
