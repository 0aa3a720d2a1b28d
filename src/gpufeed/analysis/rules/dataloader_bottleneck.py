"""DataLoaderBottleneck: the training loop spends a large share of each step waiting for the next batch."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, ClassVar

from gpufeed.analysis.finding import Finding
from gpufeed.analysis.headspace import Ceiling
from gpufeed.analysis.rules.base import Rule
from gpufeed.analysis.rules.context import Context
from gpufeed.analysis.rules.evidence_text import fmt_ms, fmt_pct, one_thread_each, workers_at
from gpufeed.analysis.rules.facts_steps import data_stall_period, speedup_without, wait_share
from gpufeed.analysis.rules.params import Param
from gpufeed.analysis.rules.predict import stated, upper_bound, with_workers
from gpufeed.analysis.rules.shared import CPU_SATURATION, INPUT_WAIT, STALL_PERIOD
from gpufeed.analysis.stats import WAIT_ASLEEP
from gpufeed.text import count


class DataLoaderBottleneck(Rule):
    """Data wait is a large share of step time (share = wait / whole step including the wait).

    Looks at the rank with the largest share, and sizes its advice from the evidence: the loader
    workers there are now, how busy they are and the cores the host has, so that it names one
    worker count that would end the wait where there are cores for it (the rules for busy, idle
    and starved workers: the rules reference, "How DataLoaderBottleneck sizes its advice").
    Estimated speedup: what the advised num_workers give (`predict.with_workers`), at most mean
    step / mean (step - wait) or the `--headspace` ceiling; evidence `est_speedup_basis` says which.
    """

    id = "DataLoaderBottleneck"
    params: ClassVar[dict[str, Param]] = {
        **INPUT_WAIT.params,  # threshold: StepOutlier reads it
        "critical": Param(0.5, "data-wait share that makes it critical", share=True),
        "min_steps": Param(5, "post-warm-up steps needed before judging"),
        "min_wait_ms": Param(
            1.0,
            "mean data wait per step (ms) below which no more workers are advised: about what "
            "handing a batch over from a loader worker costs, so they would not shorten it",
        ),
        "busy_worker_cpu": Param(
            80.0, "% of a core above which a loader worker counts as CPU-bound"
        ),
        "idle_worker_cpu": Param(
            50.0, "% of a core below which loader workers count as idle (waiting on storage)"
        ),
        "asleep_wait_cpu": Param(
            100 * WAIT_ASLEEP,
            "% of its data wait at or below which a training thread without workers counts as "
            "asleep (storage or latency), where measured",
        ),
        "receiving_wait_cpu": Param(
            50.0,
            "% of its data wait at or above which a training thread with idle workers counts as "
            "busy receiving their batches, where measured",
        ),
    }
    cpu_only = "same as on GPU runs (pin_memory advice left out)"

    def check(self, ctx: Context, p: dict[str, Any]) -> Iterator[Finding]:
        if len(ctx.steps) < p["min_steps"]:
            return
        s = ctx.most_waiting_rank
        share = wait_share(s)
        step = float(s["duration"].mean())
        wait = float(s["data_wait"].mean())
        if share < p["threshold"]:
            return
        host = str(s["host"].iloc[0])
        cores = ctx.cores_of(host)  # of the rank's own host
        compute = max(step - wait, 1e-6)
        evidence: dict[str, float | int | str] = {
            "data_wait_share": round(share, 4),
            "mean_step_ms": round(1e3 * step, 2),
            "mean_data_wait_ms": round(1e3 * wait, 2),
            "mean_compute_ms": round(1e3 * compute, 2),
            "steps": len(s),
            "num_workers": _whole(round(ctx.worker_count, 1)),  # a mean over the ranks
            "cpu_count": cores,
        }
        if not ctx.loader_seen:  # a generator's or a pool's workers: not a DataLoader's
            evidence["num_workers"] = "unknown"
            if ctx.worker_count >= 0.5:
                evidence["worker_processes_seen"] = _whole(round(ctx.worker_count, 1))
        if ctx.worker_count >= 0.5 and math.isfinite(ctx.worker_cpu):  # none, or not sampled
            evidence["worker_cpu_pct"] = round(ctx.worker_cpu, 1)
        if host in ctx.host_cpu_by_host:
            evidence["host_cpu_p50"] = round(ctx.host_cpu_by_host[host], 1)
        period = data_stall_period(s, ctx.rule_params(STALL_PERIOD))
        if period is not None:
            evidence["stall_period_steps"] = period[0]
        if ctx.steps["rank"].nunique() > 1:
            evidence["rank"] = int(s["rank"].iloc[0])
            evidence["mean_share_all_ranks"] = round(wait_share(ctx.steps), 4)
        ceiling = ctx.ceiling
        if ceiling is not None:
            evidence.update(ceiling.evidence())
            bound = upper_bound(ceiling.speedup, "the job's own ceiling (--headspace)")
        else:
            bound = upper_bound(speedup_without(s, s["data_wait"]), "every data wait removed")
        text, workers, asleep = _recommend(ctx, p, host, step, wait, share)
        predicted = bound
        if workers is not None:
            evidence["recommended_num_workers"] = workers
            predicted = with_workers(ctx, workers, asleep, p["min_wait_ms"] / 1e3)
        speedup, basis = stated(predicted, bound)
        evidence |= basis
        yield Finding(
            rule=self.id,
            severity="critical" if share >= p["critical"] else "warning",
            title=f"Input pipeline: steps wait {fmt_pct(share)} of the time for data",
            evidence=evidence,
            recommendation=text + _period_note(period) + _ceiling_note(ceiling),
            est_speedup=speedup,
        )


def _ceiling_note(ceiling: Ceiling | None) -> str:
    if ceiling is None:
        return ""
    return (
        f" Measured with --headspace: this job's steps take {fmt_ms(ceiling.ceiling_step)} fed a "
        f"kept batch against {fmt_ms(ceiling.real_step)} as it runs, so it reaches "
        f"{fmt_pct(ceiling.share)} of its own ceiling."
    )


def _period_note(period: tuple[int, int] | None) -> str:
    if period is None:
        return ""
    return (
        f" One step in {period[0]} waits much longer than the others (step % {period[0]} == "
        f"{period[1]}): the loader delivers in bursts, each worker a batch in turn, not a "
        "checkpoint or logging stall."
    )


def _recommend(
    ctx: Context,
    p: dict[str, Any],
    host: str,
    step: float,
    wait: float,
    share: float,
) -> tuple[str, int | None, bool]:
    """(the advice, the num_workers it sets or None, whether those workers wait on storage or
    latency rather than CPU): the worker count is what `est_speedup` is predicted for."""
    cores = ctx.cores_of(host)
    budget = ctx.worker_room()[1]  # as CPUBottleneck counts the cores left for workers
    need = ctx.workers_needed()
    workers = ctx.worker_count
    why = f"data wait is {fmt_pct(share)} of step time ({fmt_ms(wait)} of {fmt_ms(step)})"
    gpu_tail = (
        " Use pin_memory=True with .to(device, non_blocking=True) so copies overlap compute."
        if ctx.has_gpu
        else ""
    )
    if 1e3 * wait < p["min_wait_ms"]:
        return _advice(
            f"The wait is short ({fmt_ms(wait)} a step), less than handing a batch over from a "
            "loader worker costs (about 1 ms), so more workers would not shorten it and may slow "
            "the loop: make each batch cheaper to load (tensors kept in memory, indexed "
            "whole-batch reads instead of per-sample __getitem__, a light collate_fn), or use "
            f"larger batches so that the step's compute outweighs it. {why.capitalize()}."
        )
    if not ctx.loader_seen:
        return _advice(_no_dataloader(ctx, cores, need, budget, why, gpu_tail))
    measured = ctx.main_cpu_waiting_measured(host)
    main_wait_cpu, _ = ctx.main_cpu_split(host)
    if workers < 0.5 and measured and main_wait_cpu <= p["asleep_wait_cpu"]:
        text = (
            "The training process loads every batch itself (num_workers=0) and is on a CPU only "
            f"{main_wait_cpu:.0f}% of the time it waits, so it waits on storage or latency rather than "
            f"CPU: set num_workers={need} (workers that wait need no core each) and "
            "prefetch_factor=4, and read " + _sequential(ctx) + f". {why.capitalize()}.{gpu_tail}"
        )
        return text, need, True
    if workers < 0.5:
        n = min(need, budget)
        text = (
            f"Set num_workers={n} in the DataLoader (now 0: the training process loads every batch "
            f"itself; {cores} cores): {why}."
        )
        if need > budget:
            text += (
                f" Even {count(n, 'worker')} may not keep up (about {need} needed): "
                f"also cut the CPU cost per sample ({ctx.cut_cost()})."
            )
        return text + gpu_tail, n, False
    now = round(workers)
    wcpu = ctx.worker_cpu
    if not math.isfinite(wcpu):  # the workers' CPU was not sampled: idle or busy is unknown
        unknown = (
            "the workers' CPU was not recorded, so whether they wait on CPU or on storage is "
            "unknown"
        )
        n = min(need, budget)
        if n <= now:
            return _advice(
                f"The {cores} cores leave no room for more than the {count(now, 'worker')} now "
                f"({unknown}): cut the CPU cost per sample ({ctx.cut_cost()}), or read "
                + _sequential(ctx)
                + f". {why.capitalize()}.{gpu_tail}"
            )
        return (
            f"Set num_workers={n} (now {now}, {cores} cores; {unknown}): {why}.{gpu_tail}",
            n,
            False,
        )
    host_busy = ctx.rule_params(CPU_SATURATION)["host_busy"]
    bound = ctx.workers_cpu_bound(host, p["busy_worker_cpu"], host_busy)
    if bound and ctx.host_full(host, host_busy):
        util = ctx.host_cpu_by_host[host]
        used = ctx.role_cores.get(host, {}).get("worker", 0.0)
        outside = ctx.outside_cores(host)
        others = (
            f", {outside:.1f} cores of it by processes outside the run" if outside >= 0.5 else ""
        )
        per = " per training process" if ctx.rank_hosts.get(host, 1) > 1 else ""
        where, whose = (f" of {host}", "its") if len(ctx.rank_hosts) > 1 else ("", "the host's")
        return _advice(
            f"The loader workers are CPU-bound: they keep {used:.1f} of the {cores} cores{where} "
            f"busy ({workers_at(now, wcpu, per)}) and {whose} CPU is {util:.0f}% busy{others}, so "
            "more workers would only share the same cores: "
            + ("stop or move the other workloads, or " if others else "")
            + f"cut the CPU cost per sample ({ctx.cut_cost()}) or use a host with more cores. "
            f"{why.capitalize()}.{one_thread_each(wcpu, now)}{gpu_tail}"
        )
    if bound:
        return _within_cores(ctx, "CPU-bound", now, wcpu, cores, need, budget, why, gpu_tail)
    if measured and main_wait_cpu >= p["receiving_wait_cpu"] and main_wait_cpu > wcpu:
        return _advice(
            f"The loader workers are mostly idle ({workers_at(now, wcpu)}) while the training "
            f"thread is on a CPU {main_wait_cpu:.0f}% of the time it waits: receiving the batches is the "
            "bottleneck. Batches that are not tensors (NumPy arrays, PIL images, lists, strings) "
            "are pickled through a pipe and unpickled in the training process: return tensors "
            "from the Dataset or collate_fn, so that they travel through shared memory (a costly "
            f"sampler or batch_sampler also runs in that thread). {why.capitalize()}.{gpu_tail}"
        )
    if wcpu >= p["idle_worker_cpu"]:  # partly on a CPU: each more worker wants most of a core
        return _within_cores(ctx, "busy", now, wcpu, cores, need, budget, why, gpu_tail)
    text = (
        f"The loader workers are mostly idle ({workers_at(now, wcpu)}), so they wait on storage "
        f"or latency rather than CPU: set num_workers={need} and prefetch_factor=4, and read "
        + _sequential(ctx)
        + f". {why.capitalize()}.{gpu_tail}"
    )
    return text, need, True


def _advice(text: str) -> tuple[str, None, bool]:
    """Advice that sets no worker count: its speedup is the upper bound."""
    return text, None, False


def _within_cores(
    ctx: Context,
    state: str,
    now: int,
    wcpu: float,
    cores: int,
    need: int,
    budget: int,
    why: str,
    gpu_tail: str,
) -> tuple[str, int | None, bool]:
    """The advice for workers that use their cores: `need` of them where the cores leave room
    (`budget` per training process), else cut the cost per sample (and meanwhile `budget`)."""
    where = f"{workers_at(now, wcpu)}, {cores} cores"
    on = ctx.worker_cpu_on(ctx.worker_room()[0])  # the CPU the budget was counted with
    threads = one_thread_each(on if math.isfinite(on) else wcpu, min(need, max(budget, now)))
    if need <= budget:
        return f"Set num_workers={need} ({where}): {why}.{threads}{gpu_tail}", need, False
    meanwhile = f"; meanwhile set num_workers={budget}" if budget > now else ""
    text = (
        f"The loader workers are {state} ({where}) and about {need} would be needed, more than "
        f"the {budget} the cores leave room for per training process: cut the CPU cost per "
        f"sample ({ctx.cut_cost()}) or use a host with more cores{meanwhile}. "
        f"{why.capitalize()}.{threads}{gpu_tail}"
    )
    return text, budget if budget > now else None, False


def _no_dataloader(
    ctx: Context, cores: int, need: int, budget: int, why: str, gpu_tail: str
) -> str:
    """The advice where no DataLoader fed the steps (a generator, DALI or webdataset pipeline):
    its workers are unknown, so the pipeline's own parallelism is named, not num_workers."""
    seen = ""
    if ctx.worker_count >= 0.5 and math.isfinite(ctx.worker_cpu):
        seen = f" ({workers_at(round(ctx.worker_count), ctx.worker_cpu)} seen beside it)"
    text = (
        "The batches come through no DataLoader gpufeed saw (a generator, or a DALI or "
        f"webdataset pipeline){seen}, so how many workers prepare them is unknown: have the "
        f"pipeline prepare them in parallel, ahead of the steps (about {need} at once; more "
        "decode threads or worker processes in it, such as DALI's num_threads), or feed the "
        "steps from "
        f"`gpufeed.data.Loader`: {why}."
    )
    if need > budget:
        text += (
            f" The {cores} cores leave room for about {budget} per training process: also cut "
            f"the CPU cost per sample ({ctx.cut_cost()})."
        )
    return text + gpu_tail


def _sequential(ctx: Context) -> str:
    """What to read instead of many small files, for the kind of data this run loads."""
    if ctx.images:
        return "large sequential shards (`gpufeed pack`) instead of many small files"
    return "large sequential files (or memory-mapped arrays) instead of many small reads"


def _whole(x: float) -> float | int:
    """`x` as an int where it is one (evidence reads num_workers=2, not 2.0)."""
    return int(x) if float(x).is_integer() else x
