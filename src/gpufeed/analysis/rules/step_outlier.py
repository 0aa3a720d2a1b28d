"""StepOutlier: a few steps take far longer than the median."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np

from gpufeed.analysis.finding import Finding
from gpufeed.analysis.rules.base import Rule
from gpufeed.analysis.rules.context import Context
from gpufeed.analysis.rules.evidence_text import fmt_ms, fmt_pct
from gpufeed.analysis.rules.facts_steps import speedup_without, wait_share
from gpufeed.analysis.rules.params import Param
from gpufeed.analysis.rules.periods import slow_mask, slowed_by_others, stall_period
from gpufeed.analysis.rules.predict import stated, upper_bound
from gpufeed.analysis.rules.shared import INPUT_WAIT, STALL_PERIOD
from gpufeed.text import count


class StepOutlier(Rule):
    """Steps far above the median (robust statistics: median and MAD), with the steps named.

    A warning needs evidence to act on: at least `min_steps` outliers (one slow step alone is no
    pattern) costing at least `min_lost_share` of the run beyond the median. Steps that recur on a
    period are left to PeriodicStall (with the parameters it runs with), and steps slow mostly from
    waiting for data to DataLoaderBottleneck where it reports the rank (a loader's bursts, e.g.
    many workers sharing few cores). When more than `max_share` of steps are slow, the step time is
    spread out rather than having outliers. A slow step that overlaps a moment when the host had
    less than a core idle and processes outside the run kept `outside_cores` busy is not counted:
    its delay may be theirs (another job on a shared machine), which the user cannot act on.
    """

    id = "StepOutlier"
    params: ClassVar[dict[str, Param]] = {
        "k": Param(
            5.0,
            "robust deviations (MAD x 1.4826) of log step time above the median that make an "
            "outlier (spread in ratios: other load stretches steps by factors)",
        ),
        "min_ratio": Param(2.0, "an outlier is also at least this many times the median"),
        "min_steps": Param(2, "outlier steps needed: one slow step alone is no pattern", least=1),
        "min_lost_share": Param(
            0.05, "share of run time the outliers must cost beyond the median", share=True
        ),
        "max_share": Param(
            0.1, "above this share of slow steps there are no 'outliers'", share=True
        ),
        "outside_cores": Param(
            0.5,
            "cores kept busy by processes outside the run, on a host with less than a core idle, "
            "at which a slow step then is not counted (its delay may be theirs)",
        ),
    }
    cpu_only = "same as on GPU runs"

    def check(self, ctx: Context, p: dict[str, Any]) -> Iterator[Finding]:
        pp = ctx.rule_params(STALL_PERIOD)
        loader = ctx.rule_params(INPUT_WAIT)
        for rank, g in ctx.steps.groupby("rank", sort=True):
            d = g["duration"].to_numpy(dtype=float)
            step = g["step"].to_numpy(dtype=np.int64)
            out = slow_mask(d, p["k"], p["min_ratio"])
            period = stall_period(g, pp)
            if period is not None:
                out &= ~period.on
            if loader.get("enabled", True) and wait_share(g) >= loader["threshold"]:
                wait = g["data_wait"].to_numpy(dtype=float)
                out &= wait - np.median(wait) < 0.5 * (d - np.median(d))
            if out.mean() > p["max_share"]:
                continue
            out &= ~slowed_by_others(ctx, g, p["outside_cores"])
            if out.sum() < p["min_steps"]:
                continue
            median = float(np.median(d))
            lost = float(np.sum(d[out] - median))
            share = lost / float(d.sum())
            if share < p["min_lost_share"]:
                continue
            order = np.argsort(-d[out])
            named = [
                f"{s} ({fmt_ms(t)})" for s, t in zip(step[out][order], d[out][order], strict=True)
            ]
            n = int(out.sum())
            bound = upper_bound(speedup_without(g, lost), "the outlier steps as fast as the median")
            speedup, basis = stated(bound, bound)
            yield Finding(
                rule=self.id,
                severity="warning",
                title=f"{count(n, 'outlier step')}, up to {d.max() / median:.1f}x the median",
                evidence={
                    "outlier_steps": n,
                    "median_step_ms": round(1e3 * median, 2),
                    "max_step_ms": round(1e3 * float(d.max()), 2),
                    "lost_share": round(share, 4),
                    "rank": int(rank),
                    "steps": ", ".join(named[:10]) + (" ..." if len(named) > 10 else ""),
                    **basis,
                },
                recommendation=(
                    f"{'Step' if n == 1 else 'Steps'} "
                    f"{', '.join(str(s) for s in step[out][order][:5])} "
                    f"{'costs' if n == 1 else 'cost'} "
                    f"{fmt_pct(share)} of the run beyond the median: look at what happened then "
                    "(garbage collection, a slow storage read, a data-dependent shape causing "
                    "recompilation, another job on the host) in the timeline (`gpufeed trace`)."
                ),
                est_speedup=speedup,
            )
