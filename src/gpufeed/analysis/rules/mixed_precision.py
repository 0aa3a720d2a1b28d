"""MixedPrecision: compute-bound fp32 training on a GPU that has tensor cores."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, ClassVar

from gpufeed.analysis.finding import Finding
from gpufeed.analysis.rules.base import Rule
from gpufeed.analysis.rules.context import Context
from gpufeed.analysis.rules.facts_steps import pct, wait_share
from gpufeed.analysis.rules.params import INPUT_BOUND, Param

# NVIDIA GPUs with tensor cores (Volta and later) by product name, when no compute capability is given.
_TENSOR_CORE_NAMES = re.compile(
    r"V100|TITAN V|T4|RTX|\bA\d{1,3}\b|A100|\bH\d{2,3}\b|\bL\d{1,2}S?\b|\bB\d{3}\b|GH200|GB200"
)


class MixedPrecision(Rule):
    """A GPU with tensor cores, fp32 training and compute-bound steps: suggest AMP (bf16 or fp16).

    Needs the run's precision (meta "precision", recorded when autopatch sees whether autocast is
    used); silent when it is unknown rather than guessing.
    """

    id = "MixedPrecision"
    params: ClassVar[dict[str, Param]] = {
        "util_p50": Param(80.0, "median GPU utilization % at which steps count as compute-bound"),
        "wait_share": Param(
            INPUT_BOUND, "data-wait share below which steps are not input-bound", share=True
        ),
    }
    cpu_only = "silent: needs a GPU"

    def check(self, ctx: Context, p: dict[str, Any]) -> Iterator[Finding]:
        if not ctx.has_gpu or ctx.meta.get("precision") != "fp32" or len(ctx.steps) == 0:
            return
        gpus = ctx.meta.get("gpus") or []
        names = [str(g.get("name", "")) for g in gpus if _has_tensor_cores(g)]
        if not names:
            return
        util = pct(ctx.metric("gpu.util")["value"], 50)
        share = wait_share(ctx.steps)
        if util < p["util_p50"] or share >= p["wait_share"]:
            return
        yield Finding(
            rule=self.id,
            severity="info",
            title=f"fp32 training on tensor-core GPU ({names[0]}): use mixed precision",
            evidence={
                "gpu": names[0],
                "precision": "fp32",
                "gpu_util_p50": round(util, 1),
                "data_wait_share": round(share, 4) if ctx.wait_known else "unknown",
            },
            recommendation=(
                "The steps are compute-bound in fp32 on a GPU with tensor cores: wrap forward and "
                "loss in torch.autocast('cuda', dtype=torch.bfloat16) (or float16 with a GradScaler) "
                "and use channels_last for convolutions; convnets typically train 1.5-3x faster."
            ),
        )


def _has_tensor_cores(gpu: dict[str, Any]) -> bool:
    cc = gpu.get("compute_capability")
    if cc:
        return float(str(cc).split(",")[0]) >= 7.0
    return bool(_TENSOR_CORE_NAMES.search(str(gpu.get("name", ""))))
