"""PeriodicStall: every N-th step is slow (checkpointing, logging or evaluation every N steps)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np

from gpufeed.analysis.finding import Finding
from gpufeed.analysis.rules.base import Rule
from gpufeed.analysis.rules.context import Context
from gpufeed.analysis.rules.evidence_text import fmt_ms, fmt_pct
from gpufeed.analysis.rules.params import Param
from gpufeed.analysis.rules.periods import stall_period, waits_for_data
from gpufeed.analysis.rules.predict import stated, without_stall
from gpufeed.analysis.rules.shared import STALL_PERIOD
from gpufeed.text import ordinal


class PeriodicStall(Rule):
    """Every N-th step is slow: finds N, the phase and the cost per period, per rank.

    For each period N and phase r (steps at step % N == r), a step there is stalled when it takes
    more than `min_ratio` x the median of the other steps. N is the smallest period with a phase
    of which at least `match` are stalled, over at least `min_periods` periods, where steps slow
    at random (as often as the other steps are) would stall as many with a chance of at most
    `max_chance` over every period and phase tried (evidence `chance`; see periods.find_period).
    So other load that widens the spread of step times neither hides a period nor makes one.
    Stalls that are mostly data wait (N loader workers delivering in turn) are the input
    pipeline's: DataLoaderBottleneck reports them, with the period.
    """

    id = "PeriodicStall"
    params: ClassVar[dict[str, Param]] = (
        STALL_PERIOD.params
    )  # StepOutlier, DataLoaderBottleneck read them
    cpu_only = "same as on GPU runs"

    def check(self, ctx: Context, p: dict[str, Any]) -> Iterator[Finding]:
        for rank, g in ctx.steps.groupby("rank", sort=True):
            d = g["duration"].to_numpy(dtype=float)
            step = g["step"].to_numpy(dtype=np.int64)
            found = stall_period(g, p)
            if found is None or waits_for_data(found, g):
                continue
            n, r, stalled, median = found.n, found.r, found.stalled, found.baseline
            lost = float(np.sum(d[stalled] - median))
            share = lost / float(d.sum())
            if share < p["min_lost_share"]:
                continue
            periods = int(found.on.sum())
            stall_steps = [int(s) for s in step[stalled]]
            # removing the stall is both the advice and the most it can give
            removed = without_stall(n, float(d[~stalled].mean()), lost / periods)
            speedup, basis = stated(removed, removed)
            yield Finding(
                rule=self.id,
                severity="critical" if share >= 0.25 else "warning",
                title=f"Every {ordinal(n)} step stalls: +{fmt_ms(lost / periods)} per period",
                evidence={
                    "period_steps": n,
                    "first_stalled_step": stall_steps[0],
                    "stalled_steps": len(stall_steps),
                    "median_step_ms": round(1e3 * median, 2),
                    "mean_stalled_step_ms": round(1e3 * float(d[stalled].mean()), 2),
                    "cost_per_period_ms": round(1e3 * lost / periods, 2),
                    "lost_share": round(share, 4),
                    "chance": float(f"{found.chance:.2g}"),
                    **basis,
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
                est_speedup=speedup,
            )
            return
