"""MaxInitializationTime: a long time passes before the first training step."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from gpufeed.analysis.finding import Finding
from gpufeed.analysis.rules.base import Rule
from gpufeed.analysis.rules.context import Context
from gpufeed.analysis.rules.evidence_text import fmt_pct
from gpufeed.analysis.rules.params import Param


class MaxInitializationTime(Rule):
    """Long time from process start to the first step (imports, dataset indexing, downloads, compile).

    Fires when the slowest rank needs more than `threshold` seconds, or more than `min_seconds` that
    are also more than `share` of the run's wall time.
    """

    id = "MaxInitializationTime"
    params: ClassVar[dict[str, Param]] = {
        "threshold": Param(60.0, "seconds before the first step that are always too long"),
        "share": Param(0.25, "share of the run's wall time that is too long ...", share=True),
        "min_seconds": Param(20.0, "... once initialization takes at least this many seconds"),
    }
    cpu_only = "same as on GPU runs"

    def check(self, ctx: Context, p: dict[str, Any]) -> Iterator[Finding]:
        steps = ctx.all_steps
        if len(steps) == 0:
            return
        first = steps.groupby("rank")["start"].min()
        starts = {
            int(r["rank"]): float(r["start"])
            for r in ctx.meta.get("ranks") or []
            if r.get("start") is not None and "rank" in r
        }
        run_start = ctx.meta.get("start_time")
        init = {}
        for rank, t in first.items():
            begin = starts.get(int(rank), run_start)
            if begin is not None:
                init[int(rank)] = float(t) - float(begin)
        if not init:
            return
        rank = max(init, key=lambda r: init[r])
        seconds = init[rank]
        end = ctx.meta.get("end_time") or float(steps["end"].max())
        wall = float(end) - float(run_start if run_start is not None else min(starts.values()))
        share = seconds / wall if wall > 0 else 0.0
        if not (seconds >= p["threshold"] or (seconds >= p["min_seconds"] and share >= p["share"])):
            return
        evidence: dict[str, float | int | str] = {
            "init_seconds": round(seconds, 2),
            "wall_seconds": round(wall, 2),
            "init_share": round(share, 4),
        }
        if len(init) > 1:
            evidence["rank"] = rank
        yield Finding(
            rule=self.id,
            severity="warning",
            title=f"Slow start: {seconds:.0f} s before the first step ({fmt_pct(share)} of the run)",
            evidence=evidence,
            recommendation=(
                f"{seconds:.0f} s pass between process start and the first step: time the start-up "
                "(python -X importtime, or timestamps around dataset/model construction). Usual "
                "causes: listing or indexing many small files (pack them into shards with an index: "
                "`gpufeed pack`), downloads, building the model on CPU before moving it, "
                "torch.compile without a cache, and re-spawning loader workers (persistent_workers=True)."
            ),
        )
