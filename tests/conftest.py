"""Shared fixtures: run a real script under `gpufeed profile` and get its run directory."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

RunProfiled = Callable[..., tuple[subprocess.CompletedProcess, Path | None]]


def _gpufeed_cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpufeed.cli", *args]


def _run_dir_from(stderr: str) -> Path | None:
    m = re.search(r"gpufeed: profiling into (.+)", stderr)
    return Path(m.group(1).strip()) if m else None


@pytest.fixture
def gpufeed_cli() -> Callable[..., list[str]]:
    """`gpufeed_cli(*args)`: argv that runs this checkout's command line with the test interpreter."""
    return _gpufeed_cli


@pytest.fixture
def run_dir_from() -> Callable[[str], Path | None]:
    """`run_dir_from(stderr)`: the run directory `gpufeed profile` announced (None if none)."""
    return _run_dir_from


@pytest.fixture
def run_profiled(tmp_path: Path) -> RunProfiled:
    """`run_profiled(script_text_or_path, *args, out=tmp_path/"runs", interval=0.1, extra_env=None,
    launcher=None, timeout=180) -> (completed_process, run_dir)`.

    Runs `[launcher or python] SCRIPT ARGS` under `gpufeed profile --out OUT --interval INTERVAL`,
    capturing text output. A script given as text is written to a file in tmp_path first.
    """
    counter = iter(range(1_000_000))

    def run(
        script: str | os.PathLike[str],
        *args: str,
        out: str | os.PathLike[str] | None = None,
        interval: float = 0.1,
        extra_env: dict[str, str] | None = None,
        launcher: list[str] | None = None,
        timeout: float = 180,
    ) -> tuple[subprocess.CompletedProcess, Path | None]:
        path = Path(script) if "\n" not in str(script) and Path(script).is_file() else None
        if path is None:
            path = tmp_path / f"script_{next(counter)}.py"
            path.write_text(str(script))
        out = Path(out) if out is not None else tmp_path / "runs"
        env = {**os.environ, **(extra_env or {})}
        cmd = _gpufeed_cli("profile", "--out", str(out), "--interval", str(interval), "--")
        cmd += [*(launcher or [sys.executable]), str(path), *args]
        cp = subprocess.run(
            cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=tmp_path
        )
        return cp, _run_dir_from(cp.stderr)

    return run


@pytest.fixture
def make_run(tmp_path: Path) -> Callable[..., Path]:
    """`make_run(meta=None, system=(), ranks=None, processes=(), host="h1") -> run_dir`: a run directory
    written through the real store, without running anything.

    system: rows (time, metric, device, value); ranks: {rank: [(step, start, end, data_wait, samples,
    gpu_time), ...]}; processes: rows (time, pid, role, cpu, rss); evals: {rank: [(start, end,
    batches, samples, data_wait), ...]}; meta: merged over a finished default.
    """
    from gpufeed.profiler.session import steps_store_path, system_store_path, write_meta
    from gpufeed.profiler.store import Store

    counter = iter(range(1_000_000))

    def make(
        meta: dict | None = None,
        system: list[tuple] | tuple = (),
        ranks: dict[int, list[tuple]] | None = None,
        processes: list[tuple] | tuple = (),
        host: str = "h1",
        evals: dict[int, list[tuple]] | None = None,
    ) -> Path:
        run_dir = tmp_path / f"run{next(counter)}"
        run_dir.mkdir()
        base = {
            "name": "t",
            "command": ["python", "t.py"],
            "start_time": 1000.0,
            "end_time": 1100.0,
        }
        base.update({"exit_code": 0, "interval": 0.2, "cpu_count": 2, "hosts": [host]})
        write_meta(run_dir, {**base, **(meta or {})})
        store = Store(system_store_path(run_dir, host))
        store.write({"host": host, "interval": 0.2, "gpus": []}, system=system, processes=processes)
        store.close()
        for rank, rows in (ranks or {}).items():
            pid = 100 + rank
            store = Store(steps_store_path(run_dir, host, pid))
            info = {
                "host": host,
                "rank": rank,
                "local_rank": rank,
                "world_size": len(ranks),
                "pid": pid,
            }
            passes = (evals or {}).get(rank, ())
            store.write({**info, "start": 1000.0, "end": 1099.0}, steps=rows, evals=passes)
            store.close()
        return run_dir

    return make


@pytest.fixture
def jittered_hosts() -> Callable[..., object]:
    """`jittered_hosts(hosts=2, seconds=10.0, interval=0.2) -> Run`: an in-memory run whose hosts
    sample every `interval` with the sampler's jitter (gaps of 0.7-1.35 intervals) and never at
    the same moments; on each host one training process at 95% CPU and 2 GB RSS, 4 cores at 50%,
    and 8 GB of host memory used."""
    import numpy as np
    import pandas as pd

    from gpufeed.analysis.run import PROCESS_COLUMNS, STEP_COLUMNS, SYSTEM_COLUMNS, Run

    def make(hosts: int = 2, seconds: float = 10.0, interval: float = 0.2) -> Run:
        rng = np.random.default_rng(1)
        t0 = 1_700_000_000.0
        system, processes = [], []
        for h in range(hosts):
            gaps = interval * rng.uniform(0.7, 1.35, int(2 * seconds / interval))
            times = t0 + interval * h / hosts + np.cumsum(gaps)
            times = times[times < t0 + seconds]
            for t in times:
                system += [(t, f"node{h}", "cpu.core", str(c), 50.0) for c in range(4)]
                system += [(t, f"node{h}", "mem.used", "", 8e9)]
                processes.append((t, f"node{h}", 1000 + h, "main", 95.0, 2e9))
        meta = {"name": "hosts", "command": ["python", "t.py"], "start_time": t0,
                "end_time": t0 + seconds, "exit_code": 0, "interval": interval, "finished": True,
                "hosts": [f"node{h}" for h in range(hosts)], "cpu_count": 4 * hosts, "ranks": []}  # fmt: skip
        system_df = pd.DataFrame(system, columns=SYSTEM_COLUMNS)
        process_df = pd.DataFrame(processes, columns=PROCESS_COLUMNS)
        steps = pd.DataFrame(columns=STEP_COLUMNS)
        return Run(Path("hosts"), meta, system_df, steps, process_df)

    return make
