"""What a recommended change gives: speedups predicted from the run's own measured costs.

A finding's `est_speedup` is what its *recommended change* should give, not the most that any change
could. Each prediction here names its basis, which `benchmarks/verdict_accuracy.py` checks by
applying the change and measuring again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpufeed.analysis.rules.context import Context
from gpufeed.analysis.rules.evidence_text import fmt_ms

# Seconds the training process spends taking a batch from a loader worker, about.
HANDOVER = 1e-3


@dataclass(frozen=True)
class Prediction:
    """A predicted speedup of step throughput and what it assumes (`basis`, said in evidence)."""

    speedup: float
    basis: str


def with_workers(ctx: Context, after: int, asleep: bool, handover: float = HANDOVER) -> Prediction:
    """The most waiting rank's speedup with `after` loader workers per training process.

    The loader makes one batch in L seconds of one worker: with k workers now, all of them
    together deliver a batch per step, so L = k x step; with none, the training process loads
    each batch in its wait, so L = wait. `after` workers make batches `p` at a time, p = after
    where they wait on storage or latency (`asleep`), else no more than the cores leave room for
    (`Context.worker_room`). The step then takes max(compute, L / p) + `handover` (seconds the
    training process spends taking a batch from a worker), compute being the step without its
    wait (and at least the job's own ceiling where `--headspace` measured it).
    """
    s = ctx.most_waiting_rank
    step = float(s["duration"].mean())
    wait = float(s["data_wait"].mean())
    compute = max(step - wait, 1e-9)
    if ctx.ceiling is not None:
        compute = max(compute, ctx.ceiling.ceiling_step)
    now = round(ctx.worker_count)
    per_batch = now * step if now >= 1 else wait
    parallel = after if asleep else min(after, max(1, ctx.worker_room()[1]))
    new_step = max(compute, per_batch / max(parallel, 1)) + handover
    speedup = max(1.0, step / new_step) if new_step > 0 else 1.0
    limit = "" if asleep or parallel == after else f", {parallel} at a time on the free cores"
    return Prediction(
        speedup,
        f"num_workers={after}: a batch takes {fmt_ms(per_batch)} of one worker{limit}",
    )


def without_stall(period: int, step: float, cost: float) -> Prediction:
    """Every `period`-th step's stall of `cost` seconds gone (done asynchronously or not at all),
    the other steps taking `step` seconds on average: a period takes n x step instead of n x step
    + cost. Counted per period, not over the steps judged, whose stalls may not fall evenly."""
    if period < 1 or step <= 0:
        return Prediction(1.0, "the stall removed")
    speedup = (period * step + max(cost, 0.0)) / (period * step)
    return Prediction(
        speedup,
        f"the stall removed: {period} steps of {fmt_ms(step)} without {fmt_ms(cost)}",
    )


def upper_bound(speedup: float, why: str) -> Prediction:
    """The most the finding's subject can give (all of it removed): where the recommended change
    has no size to predict from (cut the cost per sample, do it less often)."""
    return Prediction(speedup if math.isfinite(speedup) else 1.0, f"upper bound: {why}")


def stated(predicted: Prediction, bound: Prediction) -> tuple[float, dict[str, float | str]]:
    """(`est_speedup`, the evidence that says what it is): the prediction, never above the
    bound; ``max_speedup`` is the bound, ``est_speedup_basis`` how the estimate was reckoned."""
    best = bound if predicted.speedup > bound.speedup else predicted
    speedup = round(best.speedup, 3)
    return speedup, {"max_speedup": round(bound.speedup, 3), "est_speedup_basis": best.basis}
