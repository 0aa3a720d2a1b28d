"""`Context`: the post-warm-up view of a run that every rule reads, computed once per analysis.

Warm-up: per rank, the first `warmup.steps` steps and the steps that start within `warmup.seconds` of the
rank's first step are skipped (compilation, cuDNN autotuning, worker start-up, page cache filling), but
never more than half of a rank's steps, so that a 2-minute job still gets a diagnosis. System metrics
are read over the window spanned by the remaining steps (or, with no steps, the run minus the warm-up
seconds).

The facts themselves are computed in topic modules, which `Context` delegates to and caches:
`facts_steps` (steps, window, data wait), `facts_gpu`, `facts_cpu` (cores, host CPU),
`facts_processes` (roles, loader workers) and `facts_main_cpu` (the training processes' CPU while
waiting); evidence text is `evidence_text`'s.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from gpufeed.analysis.headspace import Ceiling, measure_ceiling
from gpufeed.analysis.rules import facts_cpu, facts_gpu, facts_main_cpu, facts_processes
from gpufeed.analysis.rules import facts_steps as steps_
from gpufeed.analysis.rules.evidence_text import cut_cost as _cut_cost

# Names the rules and their tests import from here, kept where they were.
from gpufeed.analysis.rules.evidence_text import fmt_ms as fmt_ms
from gpufeed.analysis.rules.evidence_text import fmt_pct as fmt_pct
from gpufeed.analysis.rules.evidence_text import one_thread_each as one_thread_each
from gpufeed.analysis.rules.evidence_text import workers_at as workers_at
from gpufeed.analysis.rules.facts_gpu import IDLE_GPU_UTIL as IDLE_GPU_UTIL
from gpufeed.analysis.rules.facts_steps import data_stall_period as data_stall_period
from gpufeed.analysis.rules.facts_steps import pct as pct
from gpufeed.analysis.rules.facts_steps import speedup_without as speedup_without
from gpufeed.analysis.rules.facts_steps import wait_share as wait_share
from gpufeed.analysis.rules.params import Param

if TYPE_CHECKING:
    from gpufeed.analysis.run import Run

WARMUP_ID = "warmup"
WARMUP_PARAMS: dict[str, Param] = {
    "steps": Param(5, "steps skipped at the start of each rank before rules look at it"),
    "seconds": Param(2.0, "seconds after each rank's first step that are skipped as well"),
}
_EMPTY_SYSTEM = pd.DataFrame(columns=["time", "host", "metric", "device", "value"])


class Context:
    """A run restricted to its steady state, with the derived series the rules share."""

    def __init__(self, run: Run, warmup: dict[str, Any] | None = None) -> None:
        self.run = run
        self.meta: dict[str, Any] = dict(run.meta or {})
        w = {name: p.default for name, p in WARMUP_PARAMS.items()} | dict(warmup or {})
        self.warmup_steps = int(w["steps"])
        self.warmup_seconds = float(w["seconds"])
        self.params: dict[str, dict[str, Any]] = {}  # every rule's parameters in this analysis
        self._fits: dict[str | None, facts_main_cpu.Fit] = {}  # main_cpu_split's, per host
        self._measured: dict[str | None, tuple[float, float, float]] = {}  # ... measured, per host

    def rule_params(self, rule: Any) -> dict[str, Any]:
        """The parameters the rule `rule.id` runs with in this analysis, overrides included; `rule`:
        a Rule class, or a `shared.Shared` setting that another rule reads (its `rule.params`
        then the defaults where the analysis set none)."""
        return self.params.get(rule.id) or {n: p.default for n, p in rule.params.items()}

    @property
    def _ranks_meta(self) -> list[Any]:
        return self.meta.get("ranks") or []

    # --- steps (facts_steps) --------------------------------------------------------------------

    @cached_property
    def all_steps(self) -> pd.DataFrame:
        """Every recorded step with a duration, sorted by rank then step."""
        return steps_.finite_steps(self.run.steps)

    @cached_property
    def steps(self) -> pd.DataFrame:
        """Post-warm-up steps of every rank (``data_wait`` NaN read as 0)."""
        return steps_.steady_steps(
            self.all_steps, self._ranks_meta, self.warmup_steps, self.warmup_seconds
        )

    @cached_property
    def ceiling(self) -> Ceiling | None:
        """The job's own ceiling where `--headspace` measured it (`analysis.headspace`), else None."""
        return measure_ceiling(self.run.headspace, self.steps) if len(self.run.headspace) else None

    @cached_property
    def _replay_spans(self) -> list[tuple[float, float]]:
        """Replayed steps and the refill after them (`facts_steps.replay_spans`)."""
        return steps_.replay_spans(self.all_steps, self.run.headspace, self._ranks_meta)

    @cached_property
    def wait_known(self) -> bool:
        """False when no step measured its data wait (batches that came through no hooked
        DataLoader: a generator feeding `gpufeed.step()`): `steps` then reads it as 0, which
        the rules must not take for "little data wait"."""
        return bool(self.all_steps["data_wait"].notna().any())

    def steady_wait(self) -> tuple[int, float] | None:
        """(warm-up steps left out, at most of any rank; the data wait's share of the steps judged
        after them), or None where no step is judged: what `show` and the report set beside the
        share over every step, which the findings do not judge."""
        return steps_.steady_wait(self.all_steps, self.steps, self._ranks_meta)

    @cached_property
    def ranks(self) -> list[int]:
        """Ranks with post-warm-up steps."""
        return sorted(int(r) for r in self.steps["rank"].unique())

    @cached_property
    def window(self) -> tuple[float, float]:
        """(start, end) of the steady state in epoch seconds."""
        return steps_.steady_window(self.steps, self.run.system, self.meta, self.warmup_seconds)

    @cached_property
    def most_waiting_rank(self) -> pd.DataFrame:
        """The post-warm-up steps of the rank whose steps wait the largest share of their time
        for data (the one whose loader falls furthest behind)."""
        return steps_.most_waiting_rank(self.steps)

    # --- system metrics and GPUs (facts_gpu) ----------------------------------------------------

    @cached_property
    def _by_metric(self) -> dict[str, pd.DataFrame]:
        sysdf = self.run.system
        if sysdf is None or len(sysdf) == 0:
            return {}
        in_window = steps_.in_window(sysdf, self.window, self._replay_spans)
        return {str(m): g for m, g in in_window.groupby("metric", sort=False)}

    def metric(self, name: str) -> pd.DataFrame:
        """Rows (time, host, metric, device, value) of one metric inside the steady-state window;
        for GPU metrics only the GPUs the job could use (see `used_gpus`)."""
        rows = self._by_metric.get(name, _EMPTY_SYSTEM)
        if name.startswith("gpu.") and self.used_gpus is not None and len(rows):
            rows = rows[rows["device"].isin(self.used_gpus)]
        return rows

    @cached_property
    def used_gpus(self) -> set[str] | None:
        """NVML indices of the GPUs the job used; None: all that NVML reported (cannot tell).
        See `facts_gpu.used_gpus`."""
        util = self._by_metric.get("gpu.util", _EMPTY_SYSTEM)
        return facts_gpu.used_gpus(self.meta, self.visible_gpus, util)

    @cached_property
    def visible_gpus(self) -> list[str] | None:
        """The NVML indices CUDA_VISIBLE_DEVICES lists, in CUDA's order; None where it is not set
        or names UUIDs."""
        return facts_gpu.visible_gpus(self.meta)

    def gpu_of(self, local_rank: int) -> str | None:
        """The NVML index of the GPU a training process of `local_rank` uses (cuda:local_rank),
        None where CUDA_VISIBLE_DEVICES hides it."""
        return facts_gpu.gpu_of(self.visible_gpus, local_rank)

    def per_device(self, name: str) -> dict[str, np.ndarray]:
        """Values of one metric per device label ("host:device" when several hosts), time-ordered."""
        return facts_gpu.per_device(self.metric(name))

    @cached_property
    def has_gpu(self) -> bool:
        """True when NVML reported GPU utilization inside the window."""
        return len(self.metric("gpu.util")) > 0

    @cached_property
    def used_gpu(self) -> bool:
        """Whether the run used a GPU: NVML read one, or a training process initialized CUDA."""
        return self.has_gpu or any(r.get("cuda") for r in self._ranks_meta)

    # --- cores and host CPU (facts_cpu) ---------------------------------------------------------

    @cached_property
    def cpu_count(self) -> int:
        """Logical cores of the host (meta, else the number of per-core series)."""
        return facts_cpu.cpu_count(self.meta, self.run.system)

    def cores_of(self, host: str) -> int:
        """Logical cores of `host` (a combined run names each host's in `host_cpu_counts`)."""
        return facts_cpu.cores_of(self.meta, host, self.cpu_count)

    def sampled_cores(self, host: str) -> int:
        """Cores `host`'s whole-host CPU metrics (cpu.util, cpu.iowait) average over: its per-core
        series (the affinity set), which a container's CPU limit (`cores_of`) does not shrink;
        `cores_of` where it has none."""
        return self._per_core_series.get(host) or self.cores_of(host)

    @cached_property
    def _per_core_series(self) -> dict[str, int]:
        return facts_cpu.per_core_series(self.metric("cpu.core"))

    @cached_property
    def rank_hosts(self) -> dict[str, int]:
        """{host: training processes with post-warm-up steps on it}, hosts in name order."""
        ranks = self.steps.groupby("host", sort=True)["rank"].nunique()
        return {str(h): int(n) for h, n in ranks.items()}

    @cached_property
    def cores_per_rank(self) -> int:
        """Cores each training process has on its own host: the fewest over the hosts (a run
        of several hosts names each host's cores in `host_cpu_counts`)."""
        if not self.rank_hosts:
            return self.cpu_count
        return min(max(1, self.cores_of(host) // n) for host, n in self.rank_hosts.items())

    @cached_property
    def _host_util(self) -> dict[str, np.ndarray]:
        """{host: its whole-host CPU busy % samples over the window, of its `cores_of`}
        (`facts_cpu.host_util`)."""
        return facts_cpu.host_util(
            self.metric("cpu.util"), self.cores_of, self.sampled_cores, self.role_cores
        )

    @cached_property
    def host_cpu_by_host(self) -> dict[str, float]:
        """{host: median whole-host CPU busy % over the window, of the cores the run may use there
        (see `_host_util`)} (hosts that sampled it)."""
        return {host: pct(util, 50) for host, util in self._host_util.items()}

    @cached_property
    def host_cpu(self) -> float:
        """Median whole-host CPU busy % over the window, of the cores the run may use (NaN when
        not sampled)."""
        return pct(np.concatenate([np.zeros(0), *self._host_util.values()]), 50)

    def host_full(self, host: str, host_busy: float) -> bool:
        """True when `host`'s median CPU is at least `host_busy` % (False where not sampled)."""
        util = self.host_cpu_by_host.get(host, float("nan"))
        return bool(np.isfinite(util) and util >= host_busy)

    def _ours(self, host: str) -> float:
        """Cores of `host` the run's own processes keep busy."""
        return sum(self.role_cores.get(host, {}).values())

    def busy_cores(self, host: str) -> float:
        """Cores of `host` kept busy over the window: its median whole-host CPU, or what the run's
        own processes there use where that is more (the two are sampled apart)."""
        util = self.host_cpu_by_host.get(host, float("nan"))
        return facts_cpu.busy_cores(self._ours(host), util, self.cores_of(host))

    def free_cores(self, host: str) -> float:
        """Cores of `host` that neither the run nor other processes keep busy."""
        return self.cores_of(host) - self.busy_cores(host)

    def outside_cores(self, host: str) -> float:
        """Cores of `host` kept busy by processes outside the run (0 where not measured)."""
        return self.busy_cores(host) - self._ours(host)

    def workers_cpu_bound(self, host: str, busy: float, host_busy: float) -> bool:
        """True when the loader workers on `host` are limited by CPU: one at `busy` % of a core,
        or, while the host is above `host_busy` % (starved, so each gets less than it wants), at
        half that or all of them together keeping half its cores busy."""
        one = self.worker_cpu_on(host)
        return facts_cpu.workers_cpu_bound(
            one,
            self.role_cores.get(host, {}).get("worker", 0.0),
            self.cores_of(host),
            self.host_full(host, host_busy),
            busy,
        )

    # --- processes and loader workers (facts_processes) -----------------------------------------

    @cached_property
    def processes(self) -> pd.DataFrame:
        """Process samples inside the window."""
        p = self.run.processes
        if p is None or len(p) == 0:
            return pd.DataFrame(columns=facts_processes.PROCESS_COLUMNS)
        return steps_.in_window(p, self.window, self._replay_spans)

    @cached_property
    def role_cores(self) -> dict[str, dict[str, float]]:
        """{host: {role: mean number of cores the role keeps busy there over the window}}."""
        return facts_processes.role_cores(self.processes)

    @cached_property
    def worker_count(self) -> float:
        """Loader workers per training process (`facts_processes.worker_count`)."""
        return facts_processes.worker_count(self.meta, self.processes, self.rank_hosts)

    @cached_property
    def worker_cpu(self) -> float:
        """Mean CPU of one training loader worker, % of a core (NaN without workers): see
        `worker_cpu_on`."""
        return self.worker_cpu_on(None)

    def worker_cpu_on(self, host: str | None) -> float:
        """Mean CPU of one worker of the loaders that feed training (on `host`; None: on every
        host), % of a core (`facts_processes.worker_cpu_on`). NaN without workers."""
        return facts_processes.worker_cpu_on(
            self.processes, host, self.role_cores, self.rank_hosts, self.worker_count
        )

    def workers_needed(self) -> int:
        """Loader workers per training process that would end the data wait of
        `most_waiting_rank` (`facts_processes.workers_needed`)."""
        return facts_processes.workers_needed(self.most_waiting_rank, self.worker_count)

    def worker_room(self) -> tuple[str, int]:
        """(host, workers): the loader workers per training process there are cores for where
        there are fewest (`facts_processes.worker_room`). Needs steps."""
        return facts_processes.worker_room(
            self.rank_hosts, self.worker_count, self.worker_cpu_on, self.cores_of, self.free_cores
        )

    @cached_property
    def images(self) -> bool:
        """False when the training processes' DataLoaders delivered something other than images;
        True when images or not recorded."""
        return facts_processes.images(self.meta)

    @cached_property
    def loader_seen(self) -> bool:
        """False when no rank saw a DataLoader feed its steps; True where the run records no
        ranks."""
        return facts_processes.loader_seen(self.meta)

    def cut_cost(self) -> str:
        """How to cut the CPU cost per sample, for the kind of data this run loads."""
        return _cut_cost(self.images, self.used_gpu)

    # --- the training processes' CPU (facts_main_cpu) -------------------------------------------

    @cached_property
    def interval(self) -> float:
        """Sampling interval of the system sampler, seconds."""
        return float(self.meta.get("interval") or 0.2)

    def main_cpu(self, host: str | None = None) -> float:
        """Mean CPU of one training process (on `host`; None: on any host), % of a core (NaN
        without samples)."""
        return facts_processes.main_cpu(self.processes, host)

    def main_cpu_split(self, host: str | None = None) -> tuple[float, float]:
        """CPU of the training processes (on `host`; None: on every host, % of a core) while their
        steps wait on data, and otherwise.

        While waiting: measured where the steps have `data_wait_cpu`, the time the training
        threads spent on a CPU or ready for one (`data_wait_ready`: runnable but kept off a core,
        CPU they wanted on a busy host) across their data waits, over the waits' wall time (a
        thread, not the process: idle OpenMP threads spinning on other cores do not count). So
        a thread that loads on an oversubscribed host still reads as busy, and one asleep on
        workers or storage as idle. Otherwise, and always for the
        CPU while computing: each process sample averages CPU over the interval before it; with f
        the share of that interval spent in data wait, cpu = a*f + b*(1-f) is fitted by least
        squares. Clipped to what a process can use (0 to 100 x cores); NaN where the samples do not
        separate waiting from computing.
        """
        return self._main_cpu_fit(host)[0]

    def main_cpu_waiting_range(self, host: str | None = None) -> tuple[float, float]:
        """(low, high) of `main_cpu_split`'s CPU-while-waiting: about 95% confidence, clipped like
        it; a weak fit (few samples, noisy CPU) gives a wide range. NaN where there is no fit."""
        return self._main_cpu_fit(host)[1]

    def main_cpu_waiting_measured(self, host: str | None = None) -> bool:
        """Whether `main_cpu_split`'s CPU-while-waiting was measured across the waits, not fitted."""
        return bool(np.isfinite(self._measured_wait_cpu(host)[0]))

    def main_ready_while_waiting(self, host: str | None = None) -> float:
        """% of their data waits the training threads (on `host`) were ready to run but kept off
        a core: the part of the measured CPU-while-waiting that they wanted and did not get
        (NaN where not measured)."""
        return self._measured_wait_cpu(host)[2]

    def _measured_wait_cpu(self, host: str | None) -> tuple[float, float, float]:
        """`facts_main_cpu.measure_wait_cpu` of the steps, per host once."""
        if host not in self._measured:
            self._measured[host] = facts_main_cpu.measure_wait_cpu(self.steps, host)
        return self._measured[host]

    def _main_cpu_fit(self, host: str | None) -> facts_main_cpu.Fit:
        """`facts_main_cpu.fit_main_cpu`, per host once, clipped to the cores there."""
        if host not in self._fits:
            hosts = [host] if host is not None else list(self.rank_hosts)
            top = 100.0 * max([self.cores_of(h) for h in hosts] or [self.cpu_count])
            self._fits[host] = facts_main_cpu.fit_main_cpu(
                self.steps, self.processes, self.interval, host, top, self._measured_wait_cpu(host)
            )
        return self._fits[host]
