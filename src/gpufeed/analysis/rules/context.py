"""`Context`: the post-warm-up view of a run that every rule reads, computed once per analysis.

Warm-up: per rank, the first `warmup.steps` steps and the steps that start within `warmup.seconds` of the
rank's first step are skipped (compilation, cuDNN autotuning, worker start-up, page cache filling), but
never more than half of a rank's steps, so that a 2-minute job still gets a diagnosis. System metrics
are read over the window spanned by the remaining steps (or, with no steps, the run minus the warm-up
seconds).
"""

from __future__ import annotations

import math
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from gpufeed.analysis.headspace import Ceiling, measure_ceiling, refill_mask
from gpufeed.analysis.rules.params import Param
from gpufeed.analysis.rules.periods import stall_period, waits_for_data
from gpufeed.analysis.rules.shared import BUSY
from gpufeed.text import count

if TYPE_CHECKING:
    from collections.abc import Callable

    from gpufeed.analysis.run import Run

WARMUP_ID = "warmup"
IDLE_GPU_UTIL = 5.0  # NVML utilization % that a GPU no process runs kernels on never exceeds
WARMUP_PARAMS: dict[str, Param] = {
    "steps": Param(5, "steps skipped at the start of each rank before rules look at it"),
    "seconds": Param(2.0, "seconds after each rank's first step that are skipped as well"),
}


class Context:
    """A run restricted to its steady state, with the derived series the rules share."""

    def __init__(self, run: Run, warmup: dict[str, Any] | None = None) -> None:
        self.run = run
        self.meta: dict[str, Any] = dict(run.meta or {})
        w = {name: p.default for name, p in WARMUP_PARAMS.items()} | dict(warmup or {})
        self.warmup_steps = int(w["steps"])
        self.warmup_seconds = float(w["seconds"])
        self.params: dict[str, dict[str, Any]] = {}  # every rule's parameters in this analysis
        self._fits: dict[str | None, Any] = {}  # main_cpu_split's fits, per host (None: all)
        self._measured: dict[str | None, tuple[float, float, float]] = {}  # ... measured, per host

    def rule_params(self, rule: Any) -> dict[str, Any]:
        """The parameters the rule `rule.id` runs with in this analysis, overrides included; `rule`:
        a Rule class, or a `shared.Shared` setting that another rule reads (its `rule.params`
        then the defaults where the analysis set none)."""
        return self.params.get(rule.id) or {n: p.default for n, p in rule.params.items()}

    # --- steps ----------------------------------------------------------------------------------

    @cached_property
    def all_steps(self) -> pd.DataFrame:
        """Every recorded step with a duration, sorted by rank then step."""
        s = self.run.steps
        if s is None or len(s) == 0:
            return pd.DataFrame(
                columns=["host", "rank", "step", "start", "end", "duration", "data_wait"]
            )
        s = s[np.isfinite(s["duration"].to_numpy(dtype=float))]
        return s.sort_values(["rank", "step"], kind="stable").reset_index(drop=True)

    @cached_property
    def steps(self) -> pd.DataFrame:
        """Post-warm-up steps of every rank (``data_wait`` NaN read as 0)."""
        parts = []
        for _, g in self.all_steps.groupby("rank", sort=True):
            first = g["start"].iloc[0]
            warm = (np.arange(len(g)) < self.warmup_steps) | (
                g["start"].to_numpy() < first + self.warmup_seconds
            )
            skip = min(int(warm.sum()), len(g) // 2)
            parts.append(g.iloc[skip:])
        if not parts:
            return self.all_steps.iloc[0:0]
        out = pd.concat(parts, ignore_index=True)
        out = out[~refill_mask(out, self.meta.get("ranks") or [])].reset_index(drop=True)
        out["data_wait"] = out["data_wait"].fillna(0.0).clip(lower=0.0)
        out["data_wait"] = np.minimum(out["data_wait"], out["duration"])
        return out

    @cached_property
    def ceiling(self) -> Ceiling | None:
        """The job's own ceiling where `--headspace` measured it (`analysis.headspace`), else None."""
        return measure_ceiling(self.run.headspace, self.steps) if len(self.run.headspace) else None

    @cached_property
    def _replay_spans(self) -> list[tuple[float, float]]:
        """(start, end) epoch seconds of each rank's replayed steps and the refill after them:
        system and process samples there show an idle loader, not the run's own."""
        steps, spans = self.all_steps, []
        refill = refill_mask(steps, self.meta.get("ranks") or [])
        for key, g in self.run.headspace.groupby(["host", "rank"]):
            mine = (steps["host"] == key[0]) & (steps["rank"] == key[1]) & refill
            end = max(
                float(g["end"].max()), float(steps.loc[mine, "end"].max()) if mine.any() else 0
            )
            spans.append((float(g["start"].min()), end))
        return spans

    def _outside_replay(self, frame: pd.DataFrame) -> pd.DataFrame:
        for t0, t1 in self._replay_spans:
            frame = frame[(frame["time"] < t0) | (frame["time"] > t1)]
        return frame

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
        if not len(self.steps):
            return None
        steps = self.all_steps
        kept = steps[~refill_mask(steps, self.meta.get("ranks") or [])]  # refill: not warm-up
        left = kept.groupby("rank").size() - self.steps.groupby("rank").size()
        return int(left.max()), wait_share(self.steps)

    @cached_property
    def ranks(self) -> list[int]:
        """Ranks with post-warm-up steps."""
        return sorted(int(r) for r in self.steps["rank"].unique())

    @cached_property
    def window(self) -> tuple[float, float]:
        """(start, end) of the steady state in epoch seconds."""
        if len(self.steps):
            return float(self.steps["start"].min()), float(self.steps["end"].max())
        t = self.run.system["time"] if len(self.run.system) else pd.Series([0.0])
        start = self.meta.get("start_time") or float(t.min())
        end = self.meta.get("end_time") or float(t.max())
        return float(start) + self.warmup_seconds, float(end)

    # --- system metrics -------------------------------------------------------------------------

    @cached_property
    def _by_metric(self) -> dict[str, pd.DataFrame]:
        sysdf = self.run.system
        if sysdf is None or len(sysdf) == 0:
            return {}
        t0, t1 = self.window
        in_window = self._outside_replay(sysdf[(sysdf["time"] >= t0) & (sysdf["time"] <= t1)])
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

        No GPU when no training process initialized CUDA (ranks' "cuda" flag); else those
        `visible_gpus` lists; where CUDA_VISIBLE_DEVICES is not set, those that ran kernels in
        the window (a one-GPU job on an 8-GPU node leaves 7 at 0%: not the job's to judge).
        """
        flags = [r.get("cuda") for r in self.meta.get("ranks") or [] if r.get("cuda") is not None]
        if flags and not any(flags):
            return set()
        if self.visible_gpus is not None:
            return set(self.visible_gpus)
        util = self._by_metric.get("gpu.util", _EMPTY_SYSTEM)
        worked = {str(d) for d, g in util.groupby("device") if g["value"].max() > IDLE_GPU_UTIL}
        return worked if worked and worked != set(util["device"].astype(str)) else None

    @cached_property
    def visible_gpus(self) -> list[str] | None:
        """The NVML indices CUDA_VISIBLE_DEVICES lists, in CUDA's order (cuda:i is the i-th), up
        to the first entry that is not a number, as CUDA reads it; None where it is not set or
        names UUIDs (which cannot be mapped)."""
        visible = (self.meta.get("env") or {}).get("CUDA_VISIBLE_DEVICES")
        if visible is None:
            return None
        out: list[str] = []
        for part in visible.split(","):
            part = part.strip()
            if not part.isdigit():
                if not out and part and not part.startswith("-"):
                    return None  # GPU-… / MIG-… UUIDs
                break
            out.append(str(int(part)))
        return out

    def gpu_of(self, local_rank: int) -> str | None:
        """The NVML index of the GPU a training process of `local_rank` uses (cuda:local_rank),
        None where CUDA_VISIBLE_DEVICES hides it."""
        if self.visible_gpus is None:
            return str(local_rank)
        return self.visible_gpus[local_rank] if local_rank < len(self.visible_gpus) else None

    def per_device(self, name: str) -> dict[str, np.ndarray]:
        """Values of one metric per device label ("host:device" when several hosts), time-ordered."""
        rows = self.metric(name)
        multi_host = rows["host"].nunique() > 1 if len(rows) else False
        out: dict[str, np.ndarray] = {}
        for (host, device), g in rows.groupby(["host", "device"], sort=True):
            label = f"{host}:{device}" if multi_host else str(device)
            out[label] = g.sort_values("time")["value"].to_numpy(dtype=float)
        return out

    @cached_property
    def has_gpu(self) -> bool:
        """True when NVML reported GPU utilization inside the window."""
        return len(self.metric("gpu.util")) > 0

    @cached_property
    def cpu_count(self) -> int:
        """Logical cores of the host (meta, else the number of per-core series)."""
        n = _positive(self.meta.get("cpu_count"))
        if n:
            return n
        cores = self.run.system[self.run.system["metric"] == "cpu.core"]["device"].nunique()
        return int(cores) or 1

    def cores_of(self, host: str) -> int:
        """Logical cores of `host` (a combined run names each host's in `host_cpu_counts`)."""
        counts = self.meta.get("host_cpu_counts")
        return _positive(counts.get(str(host)) if isinstance(counts, dict) else None) or (
            self.cpu_count
        )

    def sampled_cores(self, host: str) -> int:
        """Cores `host`'s whole-host CPU metrics (cpu.util, cpu.iowait) average over: its per-core
        series (the affinity set), which a container's CPU limit (`cores_of`) does not shrink;
        `cores_of` where it has none."""
        return self._per_core_series.get(host) or self.cores_of(host)

    @cached_property
    def _per_core_series(self) -> dict[str, int]:
        per_core = self.metric("cpu.core").groupby("host")["device"].nunique()
        return {str(h): int(n) for h, n in per_core.items()}

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

    # --- processes --------------------------------------------------------------------------------

    @cached_property
    def processes(self) -> pd.DataFrame:
        """Process samples inside the window."""
        p = self.run.processes
        if p is None or len(p) == 0:
            return pd.DataFrame(columns=["time", "host", "pid", "role", "cpu", "rss"])
        t0, t1 = self.window
        return self._outside_replay(p[(p["time"] >= t0) & (p["time"] <= t1)])

    @cached_property
    def role_cores(self) -> dict[str, dict[str, float]]:
        """{host: {role: mean number of cores the role keeps busy there over the window}} (its
        processes' CPU summed per sample time, / 100). Per host: the hosts of a combined run
        sample at their own times, and each has its own cores."""
        out: dict[str, dict[str, float]] = {}
        for host, p in self.processes.groupby("host", sort=True):
            per_time = p.groupby(["time", "role"])["cpu"].sum().unstack(fill_value=0.0) / 100.0
            out[str(host)] = {str(role): float(v) for role, v in per_time.mean().items()}
        return out

    @cached_property
    def host_cpu_by_host(self) -> dict[str, float]:
        """{host: median whole-host CPU busy % over the window, of the cores the run may use there
        (see `_host_util`)} (hosts that sampled it)."""
        return {host: pct(util, 50) for host, util in self._host_util.items()}

    @cached_property
    def _host_util(self) -> dict[str, np.ndarray]:
        """{host: its whole-host CPU busy % samples over the window, of its `cores_of`}. Under a
        container's CPU limit the sampler averages over more cores (`sampled_cores`): the limit's
        cores are busy as far as the run's own processes use them, or as far as the host has
        fewer idle cores than the limit (other tenants do not use the run's quota)."""
        out: dict[str, np.ndarray] = {}
        for h, g in self.metric("cpu.util").groupby("host", sort=True):
            host = str(h)
            util = g["value"].to_numpy(dtype=float)
            cores, over = self.cores_of(host), self.sampled_cores(host)
            if over > cores:
                ours = sum(self.role_cores.get(host, {}).values())
                idle = over * (1 - util / 100)
                util = 100 * np.maximum(ours, cores - idle) / cores
            out[host] = np.clip(util, 0.0, 100.0)
        return out

    def host_full(self, host: str, host_busy: float) -> bool:
        """True when `host`'s median CPU is at least `host_busy` % (False where not sampled)."""
        util = self.host_cpu_by_host.get(host, float("nan"))
        return bool(np.isfinite(util) and util >= host_busy)

    def busy_cores(self, host: str) -> float:
        """Cores of `host` kept busy over the window: its median whole-host CPU, or what the run's
        own processes there use where that is more (the two are sampled apart)."""
        ours = sum(self.role_cores.get(host, {}).values())
        util = self.host_cpu_by_host.get(host, float("nan"))
        return max(ours, util / 100 * self.cores_of(host)) if np.isfinite(util) else ours

    def free_cores(self, host: str) -> float:
        """Cores of `host` that neither the run nor other processes keep busy."""
        return self.cores_of(host) - self.busy_cores(host)

    def outside_cores(self, host: str) -> float:
        """Cores of `host` kept busy by processes outside the run (0 where not measured)."""
        return self.busy_cores(host) - sum(self.role_cores.get(host, {}).values())

    def workers_cpu_bound(self, host: str, busy: float, host_busy: float) -> bool:
        """True when the loader workers on `host` are limited by CPU: one at `busy` % of a core,
        or, while the host is above `host_busy` % (starved, so each gets less than it wants), at
        half that or all of them together keeping half its cores busy."""
        one = self.worker_cpu_on(host)
        if not math.isfinite(one):
            return False
        if one >= busy:
            return True
        if not self.host_full(host, host_busy):
            return False
        together = self.role_cores.get(host, {}).get("worker", 0.0)
        return one >= busy / 2 or together >= self.cores_of(host) / 2

    @cached_property
    def most_waiting_rank(self) -> pd.DataFrame:
        """The post-warm-up steps of the rank whose steps wait the largest share of their time
        for data (the one whose loader falls furthest behind)."""
        shares = {r: wait_share(g) for r, g in self.steps.groupby("rank")}
        rank = max(shares, key=shares.__getitem__)
        return self.steps[self.steps["rank"] == rank]

    def workers_needed(self) -> int:
        """Loader workers per training process that would end the data wait of
        `most_waiting_rank`: the workers now scaled by step / compute, at least one more; with
        none (the training process loads every batch in ~wait s), wait / compute + 1, at least 2."""
        s = self.most_waiting_rank
        step, wait = float(s["duration"].mean()), float(s["data_wait"].mean())
        compute = max(step - wait, 1e-6)
        workers = self.worker_count
        if workers < 0.5:
            return max(2, math.ceil(wait / compute - 1e-9) + 1)
        return max(round(workers) + 1, math.ceil(workers * step / compute - 1e-9))

    def worker_room(self) -> tuple[str, int]:
        """(host, workers): the loader workers per training process there are cores for where
        there are fewest. On each host, its cores per training process less the one that process
        needs itself, and no more than the workers now plus the host's `free_cores` shared by its
        training processes; each worker takes a core where workers are CPU-bound now (`BUSY`)
        or not measured, more with threads inside it, and where they also wait on reads the CPU
        they take now (at least a quarter of a core); at least 1. Needs steps."""
        now = round(self.worker_count)

        def room(host: str) -> int:
            ranks = self.rank_hosts[host]
            cpu = self.worker_cpu_on(host)
            each = max(cpu / 100, 1.0 if cpu >= BUSY else 0.25) if math.isfinite(cpu) else 1.0
            most = int((self.cores_of(host) // ranks - 1) / each)
            return max(1, min(most, now + int(self.free_cores(host) / ranks / each)))

        host = min(self.rank_hosts, key=room)
        return host, room(host)

    @cached_property
    def images(self) -> bool:
        """False when the training processes' DataLoaders delivered something other than images
        (tokens, features); True when images or not recorded (the advice then assumes images)."""
        kinds = {r.get("batch_kind") for r in self.meta.get("ranks") or []} - {None}
        return not kinds or "image" in kinds

    @cached_property
    def loader_seen(self) -> bool:
        """False when no rank saw a DataLoader feed its steps (neither its workers nor what its
        batches held were recorded): batches from a generator, or a DALI or webdataset pipeline,
        whose workers are unknown. True where the run records no ranks."""
        ranks = self.meta.get("ranks") or []
        return not ranks or any(
            r.get("loader_workers") is not None or r.get("batch_kind") is not None for r in ranks
        )

    @cached_property
    def used_gpu(self) -> bool:
        """Whether the run used a GPU: NVML read one, or a training process initialized CUDA."""
        return self.has_gpu or any(r.get("cuda") for r in self.meta.get("ranks") or [])

    def cut_cost(self) -> str:
        """How to cut the CPU cost per sample, for the kind of data this run loads (augmentation
        on the GPU only where it used one)."""
        if self.images:
            gpu = ", augmentation on the GPU" if self.used_gpu else ""
            return "pre-resized shards via `gpufeed pack --resize`, reduced-size JPEG decode" + gpu
        return (
            "preprocess once ahead of time (tokenize, parse, cache the tensors) and keep only cheap "
            "per-sample work in the loader"
        )

    @cached_property
    def worker_count(self) -> float:
        """Loader workers per training process: what its DataLoader hooks saw feeding training
        steps (workers living under a second escape process sampling), else the workers alive at
        a typical sample time of each host (hosts sample at their own times), per training
        process there."""
        hooked = [r.get("loader_workers") for r in self.meta.get("ranks") or []]
        hooked = [int(n) for n in hooked if n is not None]
        if hooked:
            return float(np.mean(hooked))
        p = self.processes
        if len(p) == 0:
            return 0.0
        counts, mains = [], []
        for host, on in p.groupby("host", sort=True):
            workers = on[on["role"] == "worker"].groupby("time")["pid"].nunique()
            per_time = workers.reindex(on["time"].unique(), fill_value=0)
            n = self.rank_hosts.get(str(host)) or int(on[on["role"] == "main"]["pid"].nunique())
            counts.append(float(np.median(per_time.to_numpy())))
            mains.append(max(1, n))
        return sum(counts) / sum(mains)

    @cached_property
    def worker_cpu(self) -> float:
        """Mean CPU of one training loader worker, % of a core (NaN without workers): see
        `worker_cpu_on`."""
        return self.worker_cpu_on(None)

    def worker_cpu_on(self, host: str | None) -> float:
        """Mean CPU of one worker of the loaders that feed training (on `host`; None: on every
        host), % of a core: all workers' CPU summed per sample time, shared by `worker_count` per
        training process. So the idle workers of another loader (a persistent validation one)
        do not dilute it. NaN without workers."""
        p = self.processes
        workers = p[(p["role"] == "worker") & ((p["host"] == host) if host else True)]
        if len(workers) == 0:
            return float("nan")
        hosts = [host] if host else list(self.role_cores)
        ranks = sum(self.rank_hosts.get(h, 0) for h in hosts)
        if not ranks:  # no judged steps: the workers seen, each as itself
            return float(workers["cpu"].mean())
        feeding = self.worker_count * ranks
        if feeding < 0.5:
            return float("nan")
        return 100.0 * sum(self.role_cores.get(h, {}).get("worker", 0.0) for h in hosts) / feeding

    def main_cpu(self, host: str | None = None) -> float:
        """Mean CPU of one training process (on `host`; None: on any host), % of a core (NaN
        without samples)."""
        m = self.processes[self.processes["role"] == "main"]
        if host is not None:
            m = m[m["host"] == host]
        if len(m) == 0:
            return float("nan")
        return float(m.groupby(["host", "pid"])["cpu"].mean().mean())

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
        """(% of the wait on a CPU or ready for one, its 2-standard-error margin, % ready) from
        the steps' `data_wait_cpu` and `data_wait_ready`, over the steps that have the CPU; NaN
        unless those steps hold at least half of the data wait."""
        if host not in self._measured:
            self._measured[host] = self._measure_wait_cpu(host)
        return self._measured[host]

    def _measure_wait_cpu(self, host: str | None) -> tuple[float, float, float]:
        nan = (float("nan"), float("nan"), float("nan"))
        s = self.steps
        if "data_wait_cpu" not in s or len(s) == 0:
            return nan
        if host is not None:
            s = s[s["host"] == host]
        wait = s["data_wait"].to_numpy(dtype=float)
        cpu = s["data_wait_cpu"].to_numpy(dtype=float)
        ready = (
            s["data_wait_ready"].to_numpy(dtype=float) if "data_wait_ready" in s else cpu * np.nan
        )
        known = np.isfinite(cpu)
        total = float(wait[known].sum())
        if known.sum() < 3 or total <= 0 or total < 0.5 * float(wait.sum()):
            return nan
        w, r = wait[known], ready[known]
        c = cpu[known] + np.nan_to_num(r)
        ratio = float(c.sum()) / total
        residual = c - ratio * w
        se = float(np.sqrt(np.sum(residual**2) * len(w) / (len(w) - 1))) / total
        ready_share = 100.0 * float(r.sum()) / total if np.isfinite(r).all() else float("nan")
        return 100.0 * ratio, 200.0 * se, ready_share

    def _main_cpu_fit(self, host: str | None) -> tuple[tuple[float, float], tuple[float, float]]:
        if host not in self._fits:
            self._fits[host] = self._fit_main_cpu(host)
        return self._fits[host]

    def _fit_main_cpu(self, host: str | None) -> tuple[tuple[float, float], tuple[float, float]]:
        hosts = [host] if host is not None else list(self.rank_hosts)
        top = 100.0 * max([self.cores_of(h) for h in hosts] or [self.cpu_count])

        def clip(x: float) -> float:
            return float(min(max(x, 0.0), top))

        fit = self._fit_samples(host, clip)
        measured, margin, _ = self._measured_wait_cpu(host)
        if np.isfinite(measured):
            (_, computing), _ = fit
            return (clip(measured), computing), (clip(measured - margin), clip(measured + margin))
        return fit

    def _fit_samples(
        self, host: str | None, clip: Callable[[float], float]
    ) -> tuple[tuple[float, float], tuple[float, float]]:
        """`main_cpu_split` and its range fitted to the process samples alone."""
        nan = (float("nan"), float("nan"))
        f, cpu = self._wait_shares(host)
        if len(f) == 0:
            return nan, nan
        if f.std() < 0.05:
            if f.mean() > 0.9:
                se = 2 * float(cpu.std()) / max(1.0, np.sqrt(len(cpu)))
                a = float(cpu.mean())
                return (clip(a), float("nan")), (clip(a - se), clip(a + se))
            return nan, nan
        design = np.column_stack([f, 1.0 - f])
        (a, b), *_ = np.linalg.lstsq(design, cpu, rcond=None)
        dof = max(1, len(cpu) - 2)
        sigma2 = float(np.sum((cpu - design @ np.array([a, b])) ** 2)) / dof
        se = 2 * float(np.sqrt(sigma2 * np.linalg.pinv(design.T @ design)[0, 0]))
        return (clip(a), clip(b)), (clip(a - se), clip(a + se))

    def _wait_shares(self, host: str | None) -> tuple[np.ndarray, np.ndarray]:
        """(f, cpu) per sample of the training processes (on `host`) inside their steps: the share
        of the sample's interval spent in data wait, and the process's CPU % over it."""
        fs, cpus = [np.zeros(0)], [np.zeros(0)]
        if "pid" not in self.steps:
            return fs[0], cpus[0]
        main = self.processes[self.processes["role"] == "main"]
        for (on, pid), s in self.steps.groupby(["host", "pid"]):
            if host is not None and on != host:
                continue
            m = main[(main["host"] == on) & (main["pid"] == pid)].sort_values("time")
            t_end = m["time"].to_numpy(dtype=float)
            t_start = np.concatenate([t_end[:1] - self.interval, t_end[:-1]])
            # only samples whose interval these steps cover: one reaching into the warm-up would
            # count its waits as computing, and at the edge of the range it would sway the fit
            inside = (t_start >= s["start"].min()) & (t_end <= s["end"].max())
            if inside.sum() < 3:
                continue
            fs.append(_share_inside(s, t_start[inside], t_end[inside]))
            cpus.append(m["cpu"].to_numpy(dtype=float)[inside])
        return np.concatenate(fs), np.concatenate(cpus)

    @cached_property
    def interval(self) -> float:
        """Sampling interval of the system sampler, seconds."""
        return float(self.meta.get("interval") or 0.2)

    @cached_property
    def host_cpu(self) -> float:
        """Median whole-host CPU busy % over the window, of the cores the run may use (NaN when
        not sampled)."""
        return pct(np.concatenate([np.zeros(0), *self._host_util.values()]), 50)


def data_stall_period(steps: pd.DataFrame, p: dict[str, Any]) -> tuple[int, int] | None:
    """(N, r) when every N-th step of one rank is slow because it waits for data (most of the slow
    steps' excess over the other steps' median is data wait, as when N loader workers each deliver
    one batch in turn); None otherwise. `p`: PeriodicStall's parameters (`shared.STALL_PERIOD`, `periods.find_period`)."""
    found = stall_period(steps, p)
    if found is None or not waits_for_data(found, steps):
        return None
    return found.n, found.r


def wait_share(steps: pd.DataFrame) -> float:
    """Data wait as a share of step time: sum(wait) / sum(duration), where duration includes the wait."""
    total = float(steps["duration"].sum())
    return float(steps["data_wait"].sum()) / total if total > 0 else 0.0


def speedup_without(steps: pd.DataFrame, lost: pd.Series | float) -> float:
    """Expected speedup if `lost` seconds (per step, or in all) vanished: mean step / mean (step - lost)."""
    total = float(steps["duration"].sum())
    lost_total = float(np.sum(lost))
    remaining = total - lost_total
    if total <= 0 or remaining <= 0:
        return 1.0
    return max(1.0, total / remaining)


def _share_inside(steps: pd.DataFrame, t_start: np.ndarray, t_end: np.ndarray) -> np.ndarray:
    """Share of each interval [t_start, t_end] that the steps of one process spent in data wait."""
    s = steps.sort_values("start")
    begin = s["start"].to_numpy(dtype=float)
    wait = s["data_wait"].to_numpy(dtype=float)
    # W(t): total wait before t, piecewise linear through each wait span's start and end.
    cum = np.concatenate([[0.0], np.cumsum(wait)[:-1]])
    xs = np.column_stack([begin, begin + wait]).ravel()
    ys = np.column_stack([cum, cum + wait]).ravel()
    span = np.maximum(t_end - t_start, 1e-9)
    return np.clip((np.interp(t_end, xs, ys) - np.interp(t_start, xs, ys)) / span, 0.0, 1.0)


def pct(values: Any, q: float) -> float:
    """Percentile q (0-100) of finite values, NaN if there are none."""
    a = np.asarray(values, dtype=float)
    a = a[np.isfinite(a)]
    return float(np.percentile(a, q)) if a.size else float("nan")


def fmt_pct(share: float) -> str:
    """A share 0-1 as '42%'."""
    return f"{100 * share:.0f}%"


def fmt_ms(seconds: float) -> str:
    """A duration as '42 ms', '2.5 ms' or '80 µs' (never '0 ms' for a short one)."""
    ms = 1e3 * seconds
    if ms >= 10:
        return f"{ms:.0f} ms"
    return f"{ms:.1f} ms" if ms >= 1 else f"{1e3 * ms:.0f} µs"


_EMPTY_SYSTEM = pd.DataFrame(columns=["time", "host", "metric", "device", "value"])


def one_thread_each(worker_cpu: float, workers: int) -> str:
    """The advice to run each loader worker on one thread where one keeps more than a core busy
    (`worker_cpu` % of a core: threads of OpenCV, OpenMP or BLAS in every worker), with the worker
    count that keeps the cores `workers` such workers use busy; "" otherwise."""
    if not worker_cpu > 100:
        return ""
    each = worker_cpu / 100
    return (
        " Each worker keeps more than a core busy (threads of OpenCV, OpenMP or BLAS inside it): "
        "run one thread per worker (cv2.setNumThreads(1) and torch.set_num_threads(1) in the "
        "DataLoader's worker_init_fn, or OMP_NUM_THREADS=1) to stop them competing for cores; "
        f"with one thread each, about num_workers={max(workers, round(workers * each))} keeps "
        f"the {workers * each:.0f} cores busy that {count(workers, 'worker')} at {each:.1f} "
        "cores each do."
    )


def _positive(value: Any) -> int | None:
    """A core count read from meta.json: `value` where it is a positive whole number, else None."""
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return value if ok else None


def workers_at(n: int, cpu: float, per: str = "") -> str:
    """'1 worker at 62% CPU', '8 workers at 23% CPU each', '2 workers per training process at …'."""
    return f"{count(n, 'worker')}{per} at {cpu:.0f}% CPU{' each' * (n != 1)}"
