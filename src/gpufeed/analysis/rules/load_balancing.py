"""LoadBalancing: ranks or GPUs do unequal work, so the fast ones wait for the slow one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np

from gpufeed.analysis.finding import Finding
from gpufeed.analysis.rules.base import Rule
from gpufeed.analysis.rules.context import Context
from gpufeed.analysis.rules.evidence_text import fmt_pct
from gpufeed.analysis.rules.facts_steps import speedup_without, wait_share
from gpufeed.analysis.rules.params import Param
from gpufeed.analysis.rules.predict import stated, upper_bound


class LoadBalancing(Rule):
    """Ranks differ in step time, data wait or GPU utilization; names the slow rank.

    Unsynchronized ranks show it in their step times. Under DDP every rank's step takes as long as the
    slowest, so the straggler is the rank that waits most on data (the others wait for it inside the
    gradient all-reduce) or, on GPUs, the busiest GPU.
    """

    id = "LoadBalancing"
    params: ClassVar[dict[str, Param]] = {
        "step_ratio": Param(1.15, "slowest / fastest mean step time that counts as imbalance"),
        "wait_gap": Param(
            0.1, "difference in data-wait share between ranks that counts", share=True
        ),
        "util_gap": Param(15.0, "difference in mean GPU utilization, points, that counts"),
        "min_steps": Param(5, "post-warm-up steps needed per rank"),
    }
    cpu_only = "compares step times and data wait only"

    def check(self, ctx: Context, p: dict[str, Any]) -> Iterator[Finding]:
        groups = {int(r): g for r, g in ctx.steps.groupby("rank") if len(g) >= p["min_steps"]}
        if len(groups) < 2:
            return
        step = {r: float(g["duration"].mean()) for r, g in groups.items()}
        share = {r: wait_share(g) for r, g in groups.items()}
        evidence: dict[str, float | int | str] = {"ranks": len(groups)}
        for r in sorted(groups):
            evidence[f"rank{r}_step_ms"] = round(1e3 * step[r], 2)
            evidence[f"rank{r}_wait_share"] = round(share[r], 4)
        slow, fast = max(step, key=step.get), min(step, key=step.get)
        ratio = step[slow] / step[fast] if step[fast] > 0 else 1.0
        waiter, calm = max(share, key=share.get), min(share, key=share.get)
        gap = share[waiter] - share[calm]
        if ratio >= p["step_ratio"]:
            evidence |= {"slow_rank": slow, "step_ratio": round(ratio, 3)}
            why = f"rank {slow}'s steps take {ratio:.2f}x as long as rank {fast}'s"
            speedup = ratio
        elif gap >= p["wait_gap"]:
            evidence |= {"slow_rank": waiter, "wait_share_gap": round(gap, 4)}
            why = (
                f"rank {waiter} waits {fmt_pct(share[waiter])} of each step on data against "
                f"{fmt_pct(share[calm])} on rank {calm}; the others wait for it in the all-reduce"
            )
            slow = waiter
            g = groups[waiter]
            lost = g["data_wait"] - share[calm] * g["duration"]
            speedup = speedup_without(g, lost.clip(lower=0.0))
        else:
            found = _gpu_gap(ctx, groups, p["util_gap"])
            if found is None:
                return
            slow, busy, idle = found
            evidence |= {
                "slow_rank": slow,
                "gpu_util_busiest": round(busy, 1),
                "gpu_util_idlest": round(idle, 1),
            }
            why = f"rank {slow}'s GPU is {busy:.0f}% busy while another is {idle:.0f}%"
            speedup = None
        if speedup is not None:
            speedup, basis = stated(
                *[upper_bound(speedup, "every rank as fast as the fastest")] * 2
            )
            evidence |= basis
        yield Finding(
            rule=self.id,
            severity="warning",
            title=f"Load imbalance: rank {slow} is the straggler",
            evidence=evidence,
            recommendation=(
                f"{why[:1].upper() + why[1:]}. Give every rank the same work: equal shard counts "
                "and sample sizes per rank (drop_last), the same loader settings (num_workers) and "
                f"the same hardware; check what else runs on rank {slow}'s host, cores or GPU."
            ),
            est_speedup=None if speedup is None else round(max(1.0, speedup), 3),
        )


def _gpu_gap(
    ctx: Context, groups: dict[int, Any], util_gap: float
) -> tuple[int, float, float] | None:
    """(rank of the busiest GPU, its mean util, the idlest GPU's) when they differ by util_gap
    points: the rank on that GPU's host whose local rank's GPU (see `Context.gpu_of`) it is."""
    util = {g: float(np.mean(v)) for g, v in ctx.per_device("gpu.util").items() if len(v)}
    if len(util) < 2:
        return None
    busiest, idlest = max(util, key=util.get), min(util, key=util.get)
    if util[busiest] - util[idlest] < util_gap:
        return None
    host, _, device = busiest.rpartition(":")  # "host:device" where there are several hosts
    rank = next(
        (
            r
            for r, g in groups.items()
            if "local_rank" in g
            and (not host or str(g["host"].iloc[0]) == host)
            and ctx.gpu_of(int(g["local_rank"].iloc[0])) == device
        ),
        None,
    )
    if rank is None:
        return None
    return rank, util[busiest], util[idlest]
