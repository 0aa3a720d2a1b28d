"""IOBottleneck: steps wait on data while storage or network is the limit."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from gpufeed.analysis.finding import Finding
from gpufeed.analysis.rules.base import Rule
from gpufeed.analysis.rules.context import Context
from gpufeed.analysis.rules.evidence_text import fmt_pct
from gpufeed.analysis.rules.facts_steps import pct, speedup_without, wait_share
from gpufeed.analysis.rules.params import INPUT_BOUND, Param
from gpufeed.analysis.rules.predict import stated, upper_bound
from gpufeed.analysis.rules.shared import CPU_SATURATION
from gpufeed.text import MB


class IOBottleneck(Rule):
    """High iowait, or disk/network throughput held at a plateau, while steps wait on data.

    iowait is judged in cores: the host's mean iowait % x its cores / 100 is about how many of
    its tasks are blocked on storage while their core idles (the kernel charges each blocked
    task's wait to one idle core), so one blocked loader reads 50% on 2 cores and 6% on 16. A
    plateau is a read rate whose median is close to its p95 (the device delivers what it can, all
    the time) above a minimum rate. A network plateau counts only where the host receives well
    more than it sends: a gradient all-reduce between hosts sends as much as it receives.
    With many loader workers iowait must also amount to a share of them blocked: 15 workers
    that each wait 2% of their time on reads are not held back by storage. Nor is a plateau
    storage's where the workers are CPU-bound (CPUBottleneck's test): they read at the rate
    they decode, steadily.
    """

    id = "IOBottleneck"
    params: ClassVar[dict[str, Param]] = {
        "wait_share": Param(
            INPUT_BOUND, "data-wait share of step time needed before storage is blamed", share=True
        ),
        "iowait_cores": Param(
            0.2, "cores' worth of CPU iowait (mean iowait % x cores / 100) that counts as high"
        ),
        "iowait_loaders": Param(
            0.1,
            "share of the host's loader workers that must be blocked on reads, on average, "
            "for iowait to count (where it is more than iowait_cores)",
            share=True,
        ),
        "iowait": Param(
            0.0, "older form: mean CPU iowait % that counts as high (0: use iowait_cores)"
        ),
        "plateau": Param(
            0.7, "median / p95 read rate at or above which throughput is a plateau", share=True
        ),
        "min_rate_mb": Param(20.0, "MB/s a plateau must reach to count"),
        "rx_over_tx": Param(
            2.0,
            "network receive / send (medians) above which received bytes are data, not a "
            "collective",
        ),
    }
    cpu_only = "same as on GPU runs"

    def check(self, ctx: Context, p: dict[str, Any]) -> Iterator[Finding]:
        if len(ctx.steps) == 0:
            return
        share = wait_share(ctx.steps)
        if share < p["wait_share"]:
            return
        cpu = ctx.rule_params(CPU_SATURATION)
        bound = any(ctx.workers_cpu_bound(h, cpu["busy"], cpu["host_busy"]) for h in ctx.rank_hosts)
        evidence: dict[str, float | int | str] = {"data_wait_share": round(share, 4)}
        causes = []
        iowait = ctx.metric("cpu.iowait")
        by_host = {str(h): float(g["value"].mean()) for h, g in iowait.groupby("host", sort=True)}
        averaged = {h: ctx.sampled_cores(h) for h in by_host}  # what the sampler averaged over
        if by_host:  # the host with the most cores' worth of iowait
            host = max(by_host, key=lambda h: by_host[h] * averaged[h])
            mean, cores = by_host[host], averaged[host]
            blocked = mean * cores / 100
            loaders = ctx.worker_count * ctx.rank_hosts.get(host, 1)
            least = max(p["iowait_cores"], p["iowait_loaders"] * loaders)
            high = blocked >= least if not p["iowait"] else mean >= p["iowait"]
            if high:
                on = f" on {host}" if len(by_host) > 1 else ""
                causes.append(
                    f"CPU iowait averages {mean:.0f}%{on} ({blocked:.1f} of {cores} cores idle, "
                    "waiting on reads)"
                )
                evidence |= {"iowait_mean_pct": round(mean, 1), "iowait_cores": round(blocked, 2)}
        rates = (("disk.read", "disk reads"), ("net.rx", "network receive"))
        sent = pct(ctx.metric("net.tx")["value"], 50)
        for metric, what in () if bound else rates:  # CPU-bound workers read as they decode
            rate = ctx.metric(metric)["value"]
            p50, p95 = pct(rate, 50), pct(rate, 95)
            if metric == "net.rx" and p50 < p["rx_over_tx"] * sent:
                continue  # as much sent as received: a collective between hosts, not data
            if p95 > 0 and p50 >= p["min_rate_mb"] * MB and p50 >= p["plateau"] * p95:
                causes.append(f"{what} hold a plateau at {p50 / MB:.0f} MB/s (p95 {p95 / MB:.0f})")
                evidence[f"{metric.replace('.', '_')}_p50_mb_s"] = round(p50 / MB, 1)
                evidence[f"{metric.replace('.', '_')}_p95_mb_s"] = round(p95 / MB, 1)
        if not causes:
            return
        remote = any(k.startswith("net_rx") for k in evidence)
        fix = (
            "stream larger shards with more parallel reads (more loader workers), cache the data on "
            "local disk, or pre-resize images to cut the bytes per sample"
            if remote
            else "move the dataset to faster local storage or RAM (page cache, /dev/shm), read large "
            "sequential shards (`gpufeed pack`) instead of many small files, or pre-resize images to "
            "cut the bytes per sample"
        )
        bound = upper_bound(
            speedup_without(ctx.steps, ctx.steps["data_wait"]), "every data wait removed"
        )
        speedup, basis = stated(bound, bound)
        yield Finding(
            rule=self.id,
            severity="warning",
            title=f"Storage-bound input: {'; '.join(causes)}",
            evidence=evidence | basis,
            recommendation=f"Steps wait {fmt_pct(share)} of the time for data while {causes[0]}: {fix}.",
            est_speedup=speedup,
        )
