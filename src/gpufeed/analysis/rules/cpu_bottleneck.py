"""CPUBottleneck: the GPU is underused because some process role has run out of CPU."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import numpy as np

from gpufeed.analysis.finding import Finding
from gpufeed.analysis.rules.base import Rule
from gpufeed.analysis.rules.context import Context
from gpufeed.analysis.rules.evidence_text import fmt_pct, one_thread_each, workers_at
from gpufeed.analysis.rules.facts_steps import pct, speedup_without, wait_share
from gpufeed.analysis.rules.params import GPU_UTIL_P95, INPUT_BOUND, Param
from gpufeed.analysis.rules.predict import stated, upper_bound, with_workers
from gpufeed.analysis.rules.shared import CPU_SATURATION


class CPUBottleneck(Rule):
    """GPUs are underused while the CPU is saturated, attributed to the role that burns it.

    Roles: the loader workers (busy while steps wait on data), the training process itself (loading
    with num_workers=0, or Python/launch overhead with no data wait), or processes outside the run.
    A process counts as saturated at `busy` % of a core, or at half that while its host is above
    `host_busy` % (it is then starved rather than idle); so do a host's loader workers that
    together keep half its cores busy while it is. The training process's CPU while it waits is
    measured across each DataLoader wait (the training thread's time on a CPU or ready for one,
    over the wait's wall time: on Linux a thread kept off a core by other load still counts as
    busy), or, where it was not (a run recorded before gpufeed measured it, or batches that come
    from another iterator), fitted to the CPU samples; it must be saturated over its whole 95%
    range, and each host's training processes are judged by that host's load. A fit cannot tell
    CPU-bound from sleeping on a host so oversubscribed that the run's processes get less than
    that, nor where the samples hold about the same share of data wait each (steps about one
    sampling interval long, with little compute in them); the rule then stays silent. Free cores
    are those neither the run nor other processes keep busy;
    the workers it advises are DataLoaderBottleneck's count (`Context.workers_needed`, capped by
    `Context.worker_room`), so the two rules never name two numbers.
    """

    id = "CPUBottleneck"
    params: ClassVar[dict[str, Param]] = {
        "gpu_util_p95": Param(70.0, f"{GPU_UTIL_P95} below which the GPU counts as underused"),
        **CPU_SATURATION.params,  # busy, host_busy: DataLoaderBottleneck and IOBottleneck read them
        "wait_share": Param(
            INPUT_BOUND,
            "data-wait share of step time that ties the CPU to the input pipeline",
            share=True,
        ),
    }
    cpu_only = (
        "fires only when steps wait on data and the role loading the data (workers, or the training "
        "process while it waits) is saturated; 'GPU underused' cannot be evaluated"
    )

    def warning(self, **fields: Any) -> Finding:
        """A warning of this rule: every case below is one, with its own title and evidence."""
        return Finding(rule=self.id, severity="warning", **fields)

    def check(self, ctx: Context, p: dict[str, Any]) -> Iterator[Finding]:
        if len(ctx.steps) == 0:
            return
        gpu_p95 = pct(ctx.metric("gpu.util")["value"], 95) if ctx.has_gpu else float("nan")
        if ctx.has_gpu and gpu_p95 >= p["gpu_util_p95"]:
            return
        share = wait_share(ctx.steps)
        host_pct = ctx.host_cpu  # all hosts' median

        def saturated(cpu: float, host: str) -> bool:
            starved = ctx.host_full(host, p["host_busy"])
            return np.isfinite(cpu) and (cpu >= p["busy"] or (starved and cpu >= p["busy"] / 2))

        evidence: dict[str, float | int | str] = {
            "data_wait_share": round(share, 4) if ctx.wait_known else "unknown",
            "cpu_count": ctx.cpu_count,
            "host_cpu_p50": round(host_pct, 1) if np.isfinite(host_pct) else "n/a",
        }
        if ctx.has_gpu:
            evidence["gpu_util_p95"] = round(gpu_p95, 1)
        most = upper_bound(speedup_without(ctx.steps, ctx.steps["data_wait"]), "every wait removed")
        speedup, basis = stated(most, most)
        workers, wcpu = ctx.worker_count, ctx.worker_cpu
        waiting = share >= p["wait_share"]

        bound = any(ctx.workers_cpu_bound(h, p["busy"], p["host_busy"]) for h in ctx.rank_hosts)
        if waiting and workers >= 0.5 and bound:
            host, room = ctx.worker_room()
            free, now = ctx.free_cores(host), round(workers)
            cores, used = ctx.cores_of(host), ctx.role_cores.get(host, {}).get("worker", 0.0)
            outside = ctx.outside_cores(host)
            on = f" on {host}" if len(ctx.rank_hosts) > 1 else ""
            evidence |= {
                "role": "worker",
                "num_workers": round(workers, 1),
                "worker_cpu_pct": round(wcpu, 1),
                "worker_cores": round(used, 2),
                "cpu_count": cores,
            }
            if on:
                evidence["host"] = host
            if host in ctx.host_cpu_by_host:
                evidence["host_cpu_p50"] = round(ctx.host_cpu_by_host[host], 1)
            if outside >= 0.5:
                evidence["outside_cores"] = round(outside, 2)
            advised = now
            if room > now:  # the workers DataLoaderBottleneck sizes, as far as cores allow
                cores_free = f"{free:.0f} {'core is' if round(free) == 1 else 'cores are'}"
                advised = min(ctx.workers_needed(), room)
                advice = (
                    f"about {cores_free} still free{on}: add loader workers (num_workers={advised})"
                    if ctx.loader_seen
                    else f"about {cores_free} still free{on}: give the input pipeline more "
                    f"worker processes or decode threads (about {advised} in all; no DataLoader "
                    "fed the steps)"
                )
            elif free >= 1:
                advice = (
                    f"the workers already have every core{on} but one per training process, which "
                    f"keeps it for its own work: cut the CPU cost per sample ({ctx.cut_cost()})"
                )
            elif outside >= 0.5:
                advice = (
                    f"no cores are left{on}, and processes outside the run keep {outside:.1f} of "
                    "them busy: stop or move those, or cut the CPU cost per sample "
                    f"({ctx.cut_cost()})"
                )
            else:
                advice = f"no cores are left{on}: cut the CPU cost per sample ({ctx.cut_cost()})"
            if advised > now:
                speedup, basis = stated(with_workers(ctx, advised, asleep=False), most)
            yield self.warning(
                title=f"CPU-bound loader workers: {workers_at(round(workers), wcpu)}",
                evidence=evidence | basis,
                recommendation=(
                    f"The loader workers use {used:.1f} of {cores} cores{on} while steps wait "
                    f"{fmt_pct(share)} of the time for data; {advice}."
                    + one_thread_each(ctx.worker_cpu_on(host), advised)
                ),
                est_speedup=speedup,
            )
            return

        several = len(ctx.rank_hosts) > 1
        loader = None
        if waiting and workers < 0.5:  # the host where the training processes load, saturated
            loader = _saturated_host(ctx, lambda h: ctx.main_cpu_waiting_range(h)[0], saturated)
        if loader is not None:
            (loading, computing), (low, high) = (
                ctx.main_cpu_split(loader),
                ctx.main_cpu_waiting_range(loader),
            )
            measured = ctx.main_cpu_waiting_measured(loader)
            ready = ctx.main_ready_while_waiting(loader)  # NaN where not measured
            # measured: the thread that iterates the loader; fitted: the whole process
            one, many = ("thread", "threads") if measured else ("process", "processes")
            evidence |= {
                "role": "main",
                "main_cpu_while_waiting_pct": round(loading, 1),
                "main_cpu_while_waiting_range": f"{low:.0f}-{high:.0f}",
                "main_cpu_while_waiting_from": "measured" if measured else "fitted",
                "main_ready_while_waiting_pct": round(ready, 1) if np.isfinite(ready) else "n/a",
                "main_cpu_while_computing_pct": round(computing, 1)
                if np.isfinite(computing)
                else "n/a",
            } | _host_evidence(ctx, loader, several)
            queued = f", {ready:.0f} points of it waiting for a free core" if ready >= 5 else ""
            who = (
                f"the training {many} on {loader} run at {loading:.0f}% CPU each "
                f"({low:.0f}-{high:.0f}%{queued}) while their"
                if several
                else f"the training {one} runs at {loading:.0f}% CPU ({low:.0f}-{high:.0f}%"
                f"{queued}) while its"
            )
            how, move = (
                (
                    "With num_workers=0",
                    "move loading to worker processes (DataLoader num_workers > 0, see "
                    "DataLoaderBottleneck for the count)",
                )
                if ctx.loader_seen
                else (
                    "With no DataLoader seen,",
                    "move loading out of the training thread (decode threads or worker processes "
                    "in the pipeline, or `gpufeed.data.Loader`; see DataLoaderBottleneck)",
                )
            )
            if ctx.loader_seen:  # as many workers as DataLoaderBottleneck advises
                advised = min(ctx.workers_needed(), ctx.worker_room()[1])
                speedup, basis = stated(with_workers(ctx, advised, asleep=False), most)
            yield self.warning(
                title="CPU-bound training process: it decodes and augments the data itself",
                evidence=evidence | basis,
                recommendation=(
                    f"{how} {who} steps wait {fmt_pct(share)} of the time for data: {move}."
                ),
                est_speedup=speedup,
            )
            return

        if not ctx.has_gpu:
            return
        launching = _saturated_host(ctx, ctx.main_cpu, saturated)
        if not waiting and ctx.wait_known and launching is not None:
            main = ctx.main_cpu(launching)
            evidence |= {"role": "main", "main_cpu_pct": round(main, 1)}
            evidence |= _host_evidence(ctx, launching, several)
            who = (
                f"The training processes on {launching} run at {main:.0f}% CPU each"
                if several
                else f"The training process runs at {main:.0f}% CPU"
            )
            yield self.warning(
                title="CPU-bound training process: Python and kernel-launch overhead starve the GPU",
                evidence=evidence,
                recommendation=(
                    f"{who} with p95 GPU utilization "
                    f"{gpu_p95:.0f}% and little data wait: give the GPU bigger pieces of work "
                    "(larger batch), torch.compile or CUDA graphs, and keep .item()/print calls out "
                    "of the step."
                ),
            )
            return
        other = _busiest_outside(ctx, p["host_busy"])
        if other is not None:
            host, util, busy_cores, ours = other
            cores, several = ctx.cores_of(host), len(ctx.host_cpu_by_host) > 1
            whose = host if several else "The host"
            evidence |= {
                "role": "other",
                "run_cores": round(ours, 2),
                "host_busy_cores": round(busy_cores, 2),
                "host_cpu_p50": round(util, 1),
                "cpu_count": cores,
            }
            if several:
                evidence["host"] = host
            yield self.warning(
                title="CPU saturated by processes outside the training run",
                evidence=evidence,
                recommendation=(
                    f"{whose}'s CPU is {util:.0f}% busy but the run itself uses only {ours:.1f} "
                    f"of its {cores} cores: stop or move the other workloads, or pin the training "
                    "to its own cores."
                ),
            )


def _saturated_host(
    ctx: Context, cpu_on: Callable[[str], float], saturated: Callable[[float, str], bool]
) -> str | None:
    """The host of training processes whose CPU (`cpu_on(host)`) is saturated there, the
    busiest if several are; None if none is."""
    found = [(cpu_on(h), h) for h in ctx.rank_hosts if saturated(cpu_on(h), h)]
    return max(found)[1] if found else None


def _host_evidence(ctx: Context, host: str, several: bool) -> dict[str, float | int | str]:
    """The evidence that names `host`, its cores and its CPU, where a run has several hosts."""
    if not several:
        return {}
    util = ctx.host_cpu_by_host.get(host, float("nan"))
    return {
        "host": host,
        "cpu_count": ctx.cores_of(host),
        "host_cpu_p50": round(util, 1) if np.isfinite(util) else "n/a",
    }


def _busiest_outside(ctx: Context, host_busy: float) -> tuple[str, float, float, float] | None:
    """(host, its median CPU %, busy cores, the run's cores there) for the saturated host (median
    CPU at least `host_busy` %) where processes outside the run keep the most cores busy, at
    least half of them; None if there is none."""
    found: list[tuple[float, tuple[str, float, float, float]]] = []
    for host, util in ctx.host_cpu_by_host.items():
        if not ctx.host_full(host, host_busy):
            continue
        cores, outside = ctx.cores_of(host), ctx.outside_cores(host)
        if outside >= cores / 2:
            busy = ctx.busy_cores(host)
            found.append((outside / cores, (host, util, busy, busy - outside)))
    return max(found)[1] if found else None
