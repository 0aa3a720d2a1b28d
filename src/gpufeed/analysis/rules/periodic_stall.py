"""PeriodicStall: every N-th step is slow (checkpointing, logging or evaluation every N steps)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np

from gpufeed.analysis.finding import Finding
from gpufeed.analysis.rules.base import Param, Rule
from gpufeed.analysis.rules.context import (
    Context,
    data_stall_period,
    find_period,
    fmt_ms,
    fmt_pct,
    slow_mask,
    speedup_without,
)


class PeriodicStall(Rule):
    """Every N-th step is slow: finds N, the phase and the cost per period, per rank.

    A step is slow when it is more than `k` robust deviations and `min_ratio` x above the median; N is
    the smallest period that holds at least `match` of the slow steps and whose steps are at least
    `match` slow. Stalls that are mostly data wait (N loader workers delivering in turn) are the
    input pipeline's: DataLoaderBottleneck reports them, with the period.
    """

    id = "PeriodicStall"
    params: ClassVar[dict[str, Param]] = {
        "k": Param(5.0, "robust deviations (MAD x 1.4826) above the median that make a step slow"),
        "min_ratio": Param(1.5, "a slow step is also at least this many times the median"),
        "match": Param(
            0.7, "share of slow steps on the period, and of period steps that are slow", share=True
        ),
        "min_periods": Param(3, "periods that must be seen", least=2),
        "min_lost_share": Param(0.02, "share of run time the stalls must cost", share=True),
    }
    cpu_only = "same as on GPU runs"

    def check(self, ctx: Context, p: dict[str, Any]) -> Iterator[Finding]:
        for rank, g in ctx.steps.groupby("rank", sort=True):
            d = g["duration"].to_numpy(dtype=float)
            step = g["step"].to_numpy(dtype=np.int64)
            slow = slow_mask(d, p["k"], p["min_ratio"])
            found = find_period(step, slow, p["match"], int(p["min_periods"]))
            if found is None:
                continue
            n, r = found
            if data_stall_period(g, p) is not None:
                continue
            stalled = slow & (step % n == r)
            median = float(np.median(d))
            lost = float(np.sum(d[stalled] - median))
            share = lost / float(d.sum())
            if share < p["min_lost_share"]:
                continue
            periods = int((step % n == r).sum())
            stall_steps = [int(s) for s in step[stalled]]
            yield Finding(
                rule=self.id,
                severity="critical" if share >= 0.25 else "warning",
                title=f"Every {n}th step stalls: +{fmt_ms(lost / periods)} per period",
                evidence={
                    "period_steps": n,
                    "first_stalled_step": stall_steps[0],
                    "stalled_steps": len(stall_steps),
                    "median_step_ms": round(1e3 * median, 2),
                    "mean_stalled_step_ms": round(1e3 * float(d[stalled].mean()), 2),
                    "cost_per_period_ms": round(1e3 * lost / periods, 2),
                    "lost_share": round(share, 4),
                    "rank": int(rank),
                    "stalled_step_list": ", ".join(map(str, stall_steps[:10]))
                    + (" ..." if len(stall_steps) > 10 else ""),
                },
                recommendation=(
                    f"Something runs every {n} steps (step % {n} == {r}) and costs "
                    f"{fmt_ms(lost / periods)} each time, {fmt_pct(share)} of the run: typically "
                    "checkpointing, logging, metrics syncs or evaluation callbacks. Do it less often, "
                    "asynchronously (a background thread, torch.distributed.checkpoint.async_save), or "
                    "on rank 0 only without blocking the others."
                ),
                est_speedup=round(speedup_without(g, lost), 3),
            )
            return
