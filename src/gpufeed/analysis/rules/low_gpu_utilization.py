"""LowGPUUtilization: the GPU is idle much of the time, steadily or in deep dips."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np

from gpufeed.analysis.finding import Finding
from gpufeed.analysis.rules.base import Rule
from gpufeed.analysis.rules.context import Context
from gpufeed.analysis.rules.evidence_text import fmt_pct
from gpufeed.analysis.rules.facts_steps import pct, wait_share
from gpufeed.analysis.rules.params import GPU_UTIL_P95, INPUT_BOUND, Param


class LowGPUUtilization(Rule):
    """Low p95 GPU utilization, or a high p95 with deep, frequent dips (fluctuation).

    One finding per run, naming the GPUs concerned; the recommendation points at the cause the other
    evidence shows (data wait, or too little work per step).
    """

    id = "LowGPUUtilization"
    params: ClassVar[dict[str, Param]] = {
        "low_p95": Param(70.0, f"{GPU_UTIL_P95} below which a GPU counts as underused"),
        "dip": Param(10.0, "utilization % below which a sample counts as a dip"),
        "dip_share": Param(
            0.2, "share of samples in dips that makes a busy GPU fluctuate", share=True
        ),
        "min_samples": Param(10, "GPU samples needed in the window"),
    }
    cpu_only = "silent: no GPU utilization to read"

    def check(self, ctx: Context, p: dict[str, Any]) -> Iterator[Finding]:
        low, dipping = [], []
        evidence: dict[str, float | int | str] = {}
        for gpu, util in ctx.per_device("gpu.util").items():
            if len(util) < p["min_samples"]:
                continue
            p50, p95 = pct(util, 50), pct(util, 95)
            dips = float(np.mean(util < p["dip"]))
            if p95 < p["low_p95"]:
                low.append(gpu)
            elif dips >= p["dip_share"]:
                dipping.append(gpu)
            else:
                continue
            evidence |= {
                f"gpu{gpu}_util_p50": round(p50, 1),
                f"gpu{gpu}_util_p95": round(p95, 1),
                f"gpu{gpu}_dip_share": round(dips, 3),
            }
        if not low and not dipping:
            return
        share = wait_share(ctx.steps) if len(ctx.steps) else 0.0
        evidence["data_wait_share"] = round(share, 4) if ctx.wait_known else "unknown"
        if not ctx.wait_known:
            cause = (
                "whether its steps wait for data was not measured (the batches came through no "
                "DataLoader gpufeed hooks), so time the loop on synthetic data to tell input from "
                "compute; if the input keeps up, raise the batch size, use AMP and channels_last, "
                "torch.compile, and avoid host syncs (.item(), .cpu()) inside the step"
            )
        elif share >= INPUT_BOUND:  # where the input rules fire by default
            cause = (
                f"steps wait {fmt_pct(share)} of the time for data: fix the input pipeline first "
                "(see DataLoaderBottleneck / CPUBottleneck / IOBottleneck)"
            )
        else:
            cause = (
                "data wait is small, so the GPU gets too little work per step: raise the batch size "
                "(see BatchSize), use AMP and channels_last, torch.compile, and avoid host syncs "
                "(.item(), .cpu()) inside the step"
            )
        what = []
        if low:
            what.append(f"GPU {', '.join(low)} below {p['low_p95']:.0f}% at p95")
        if dipping:
            what.append(f"GPU {', '.join(dipping)} busy at p95 but idle in many dips")
        yield Finding(
            rule=self.id,
            severity="warning",
            title="Low GPU utilization: " + "; ".join(what),
            evidence=evidence,
            recommendation=f"The GPU idles: {cause}.",
        )
