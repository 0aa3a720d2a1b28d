"""BatchSize: GPU compute and GPU memory both mostly idle with no input bottleneck."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, ClassVar

from gpufeed.analysis.finding import Finding
from gpufeed.analysis.rules.base import Rule
from gpufeed.analysis.rules.context import Context
from gpufeed.analysis.rules.facts_steps import pct, wait_share
from gpufeed.analysis.rules.params import GPU_UTIL_P95, INPUT_BOUND, Param


class BatchSize(Rule):
    """GPU utilization and GPU memory both low while steps are measured not to wait on data: the batch is too small.

    Suggests a batch grown by the factor the free memory allows (power of two), with the linear
    learning-rate scaling note, or a smaller GPU.
    """

    id = "BatchSize"
    params: ClassVar[dict[str, Param]] = {
        "util_p95": Param(60.0, f"{GPU_UTIL_P95} below which the GPU counts as underused"),
        "mem_share": Param(
            0.5, "p95 used / total GPU memory below which memory counts as unused", share=True
        ),
        "wait_share": Param(
            INPUT_BOUND,
            "data-wait share at or above which the input pipeline is blamed instead",
            share=True,
        ),
        "headroom": Param(0.8, "share of GPU memory a bigger batch may fill", share=True),
    }
    cpu_only = "silent: needs GPU utilization and memory"

    def check(self, ctx: Context, p: dict[str, Any]) -> Iterator[Finding]:
        if not ctx.has_gpu or len(ctx.steps) == 0:
            return
        share = wait_share(ctx.steps)
        if share >= p["wait_share"] or not ctx.wait_known:  # the input may be what starves it
            return
        util = ctx.per_device("gpu.util")
        used = ctx.per_device("gpu.mem_used")
        total = ctx.per_device("gpu.mem_total")
        gpus = [g for g in util if g in used and g in total and len(total[g])]
        if not gpus:
            return
        util_p95 = max(pct(util[g], 95) for g in gpus)
        mem_used = max(pct(used[g], 95) for g in gpus)
        mem_total = min(float(total[g].max()) for g in gpus)
        mem_share = mem_used / mem_total if mem_total > 0 else 1.0
        if util_p95 >= p["util_p95"] or mem_share >= p["mem_share"]:
            return
        factor = 2 ** max(1, int(math.log2(max(2.0, p["headroom"] / max(mem_share, 1e-3)))))
        batch = float(ctx.steps["samples"].median()) if "samples" in ctx.steps else float("nan")
        evidence: dict[str, float | int | str] = {
            "gpu_util_p95": round(util_p95, 1),
            "gpu_mem_used_p95_gib": round(mem_used / 2**30, 2),
            "gpu_mem_total_gib": round(mem_total / 2**30, 2),
            "gpu_mem_share": round(mem_share, 3),
            "data_wait_share": round(share, 4),
        }
        if math.isfinite(batch):
            evidence["batch_size"] = int(batch)
            target = f"batch size {int(batch) * factor} (now {int(batch)})"
        else:
            target = f"a batch {factor}x larger"
        yield Finding(
            rule=self.id,
            severity="warning",
            title=f"Batch too small: GPU {util_p95:.0f}% busy at p95 and {mem_share:.0%} of its memory used",
            evidence=evidence,
            recommendation=(
                f"Try {target}: memory allows about {factor}x; scale the learning rate with the batch "
                "(linear rule, with a few warm-up epochs). If the batch must stay, a smaller, cheaper "
                "GPU would do the same work."
            ),
        )
