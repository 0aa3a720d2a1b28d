"""`RunBuilder`: synthetic `Run`s from plain lists, for specifying rules one behaviour at a time;
`rules` (the findings of a run by rule) and `jittered` (step times with a little noise)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpufeed.analysis.finding import Finding
from gpufeed.analysis.rules import run_rules
from gpufeed.analysis.run import PROCESS_COLUMNS, STEP_COLUMNS, SYSTEM_COLUMNS, Run

T0 = 1_700_000_000.0


class RunBuilder:
    """Accumulates steps, system metrics and process samples on one host; `build()` makes the Run."""

    def __init__(self, interval: float = 0.1, cpu_count: int = 8, host: str = "node0") -> None:
        self.interval, self.cpu_count, self.host = interval, cpu_count, host
        self._steps: list[tuple] = []
        self._system: list[tuple] = []
        self._proc: list[tuple] = []
        self.meta: dict[str, Any] = {}
        self.ranks: list[dict[str, Any]] = []

    def steps(
        self,
        durations: Sequence[float],
        waits: Sequence[float] | float = 0.0,
        rank: int = 0,
        start: float = T0 + 1.0,
        samples: float = 32,
        process_start: float = T0,
        wait_cpu: float = np.nan,
        batch_kind: str | None = "image",
    ) -> RunBuilder:
        """Back-to-back steps of one rank; its training process has pid 1000 + rank and uses
        `wait_cpu` % of a core while its steps wait (NaN: not measured). Its DataLoader delivered
        `batch_kind` batches (None: no DataLoader was seen, as with a generator feeding the steps)."""
        d = np.asarray(durations, dtype=float)
        w = np.broadcast_to(np.asarray(waits, dtype=float), d.shape)
        ends = start + np.cumsum(d)
        for i, (dur, wait, end) in enumerate(zip(d, w, ends, strict=True)):
            self._steps.append(
                (self.host, rank, rank, 1000 + rank, i, end - dur, end, dur, wait, samples, np.nan)
                + (np.nan,) * 7  # phases (host clock, other, GPU clock): not measured
                + (wait * wait_cpu / 100, 0.0 if np.isfinite(wait_cpu) else np.nan)
            )
        self.ranks.append(
            {
                "host": self.host,
                "rank": rank,
                "local_rank": rank,
                "world_size": None,
                "pid": 1000 + rank,
                "start": process_start,
                "end": float(ends[-1]) + 0.5,
                "batch_kind": batch_kind,
            }
        )
        return self

    @property
    def span(self) -> tuple[float, float]:
        ends = [s[6] for s in self._steps] or [T0 + 10.0]
        return T0, max(ends) + 0.5

    def times(self) -> np.ndarray:
        t0, t1 = self.span
        return np.arange(t0, t1, self.interval)

    def metric(
        self, name: str, value: float | Callable[[np.ndarray], np.ndarray], device: str = ""
    ) -> RunBuilder:
        """A system metric sampled every interval: a constant or a function of time since start."""
        t = self.times()
        v = value(t - T0) if callable(value) else np.full(len(t), float(value))
        self._system += [
            (ti, self.host, name, device, float(vi)) for ti, vi in zip(t, v, strict=True)
        ]
        return self

    def process(
        self,
        pid: int,
        role: str,
        cpu: float | Callable[[np.ndarray], np.ndarray],
        rss: float | Callable[[np.ndarray], np.ndarray] = 5e8,
    ) -> RunBuilder:
        """Samples of one process (cpu in % of a core, rss in bytes)."""
        t = self.times()
        c = cpu(t - T0) if callable(cpu) else np.full(len(t), float(cpu))
        r = rss(t - T0) if callable(rss) else np.full(len(t), float(rss))
        self._proc += [
            (ti, self.host, pid, role, float(ci), float(ri))
            for ti, ci, ri in zip(t, c, r, strict=True)
        ]
        return self

    def gpu(
        self,
        util: float | Callable,
        mem_used: float | Callable = 4e9,
        total: float = 80e9,
        device: str = "0",
    ) -> RunBuilder:
        """An NVML-style GPU: utilization %, memory used and total."""
        self.metric("gpu.util", util, device).metric("gpu.mem_used", mem_used, device)
        self.meta.setdefault("gpus", []).append(
            {"index": int(device), "name": "NVIDIA H100 80GB HBM3", "memory_total": total}
        )
        return self.metric("gpu.mem_total", total, device)

    def build(self, **meta: Any) -> Run:
        t0, t1 = self.span
        info = (
            {
                "name": "synthetic",
                "command": ["python", "train.py"],
                "start_time": t0,
                "end_time": t1,
                "exit_code": 0,
                "interval": self.interval,
                "hosts": [self.host],
                "cpu_count": self.cpu_count,
                "cpu_model": "test",
                "gpus": [],
                "ranks": self.ranks,
                "finished": True,
            }
            | self.meta
            | meta
        )
        return Run(
            Path("synthetic"),
            info,
            pd.DataFrame(self._system, columns=SYSTEM_COLUMNS),
            pd.DataFrame(self._steps, columns=STEP_COLUMNS),
            pd.DataFrame(self._proc, columns=PROCESS_COLUMNS),
        )


def healthy(b: RunBuilder, n: int = 200, step: float = 0.1, seed: int = 0) -> RunBuilder:
    """A steady run: small data wait, low jitter, busy GPU, workers lightly loaded, flat memory."""
    rng = np.random.default_rng(seed)
    d = step * (1 + 0.03 * rng.standard_normal(n))
    b.steps(d, waits=0.002)
    b.metric("cpu.util", 40.0).metric("cpu.iowait", 0.5)
    for core in range(b.cpu_count):
        b.metric("cpu.core", 40.0, str(core))
    b.process(1000, "main", 100.0, 3e9)
    for w in range(4):
        b.process(2000 + w, "worker", 30.0)
    return b


def rules(run: Run, **overrides: Any) -> dict[str, Finding]:
    """The findings of `run` by rule name (rule parameters overridden as in `run_rules`)."""
    return {f.rule: f for f in run_rules(run, **overrides)}


def jittered(n: int, step: float = 0.05, seed: int = 0) -> np.ndarray:
    """`n` step times of about `step` seconds, 5% noise."""
    return step * (1 + 0.05 * np.random.default_rng(seed).standard_normal(n))
