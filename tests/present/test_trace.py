"""The Chrome/Perfetto trace: tracks per rank with step and data-wait spans, counters, a window, a size cap."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import gpufeed
from gpufeed.analysis.run import Run
from gpufeed.analysis.timeline import WindowError, timeline, window
from gpufeed.present import trace as present_trace
from gpufeed.present.trace import TraceError

T0 = 1_700_000_000.0


def build_trace(run: Run, **options: Any) -> dict[str, Any]:
    """The trace of `run` as `gpufeed trace` builds it: from its `Timeline`."""
    return present_trace.build_trace(
        run,
        window(run, timeline(run), options.pop("start", None), options.pop("end", None)),
        **options,
    )


def two_rank_run(n: int = 50) -> Run:
    """Two ranks on one host, 0.1 s steps (rank 1 waits 40 ms of each), sampled every 0.1 s."""
    rows = []
    for rank, wait in ((0, 0.0), (1, 0.04)):
        for i in range(n):
            start = T0 + 1 + 0.1 * i
            rows.append(
                ("node0", rank, rank, 100 + rank, i, start, start + 0.1, 0.1, wait, 8.0, np.nan)
            )
    steps = pd.DataFrame(rows, columns=["host", "rank", "local_rank", "pid", "step", "start", "end",
                                        "duration", "data_wait", "samples", "gpu_time"])  # fmt: skip
    t = T0 + np.arange(0, 1 + 0.1 * n, 0.1)
    system = pd.concat(
        [
            pd.DataFrame({"time": t, "host": "node0", "metric": m, "device": d, "value": v})
            for m, d, v in (
                ("cpu.util", "", 50.0),
                ("cpu.core", "0", 40.0),
                ("cpu.core", "1", 60.0),
                ("disk.read", "", 5e6),
            )
        ]
    )
    processes = pd.DataFrame(
        {"time": np.tile(t, 3), "host": "node0", "pid": np.repeat([100, 101, 200], len(t)),
         "role": np.repeat(["main", "main", "worker"], len(t)), "cpu": 50.0, "rss": 1e9}
    )  # fmt: skip
    meta = {"name": "ddp", "start_time": T0, "end_time": T0 + 1 + 0.1 * n, "hosts": ["node0"]}
    return Run(Path("ddp"), meta, system, steps, processes)


def test_one_thread_per_rank_with_step_spans_and_nested_data_wait() -> None:
    events = build_trace(two_rank_run())["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert names == {(1, 1): "rank 0 (pid 100)", (1, 2): "rank 1 (pid 101)"}
    assert [e["args"]["name"] for e in events if e["name"] == "process_name"] == ["node0"]
    steps = [e for e in events if e["ph"] == "X" and e["cat"] == "step"]
    waits = [e for e in events if e["ph"] == "X" and e["cat"] == "data"]
    assert len(steps) == 100 and {e["tid"] for e in steps} == {1, 2}
    assert len(waits) == 50 and {e["tid"] for e in waits} == {2}  # rank 0 never waits
    by_start = {(e["tid"], e["ts"]): e for e in steps}
    for w in waits:  # each wait sits at the start of its step, inside it
        step = by_start[(w["tid"], w["ts"])]
        assert w["dur"] == pytest.approx(40_000) and w["dur"] <= step["dur"] == pytest.approx(
            100_000
        )
    first = min(steps, key=lambda e: (e["tid"], e["ts"]))
    assert first["ts"] == pytest.approx(1e6) and first["args"]["step"] == 0  # µs from the run start


def test_counter_tracks_for_system_metrics_and_cpu_by_role() -> None:
    events = build_trace(two_rank_run())["traceEvents"]
    counters = {}
    for e in events:
        if e["ph"] == "C":
            counters.setdefault(e["name"], []).append(e["args"])
    assert set(counters) == {
        "cpu.util (%)",
        "cpu.core (%)",
        "disk.read (MB/s)",
        "CPU by role (cores)",
    }
    assert counters["cpu.core (%)"][0] == {"0": 40.0, "1": 60.0}
    assert counters["disk.read (MB/s)"][0] == {"value": 5.0}
    assert counters["CPU by role (cores)"][0] == {"main": 1.0, "worker": 0.5}


def test_a_window_keeps_only_what_overlaps_it() -> None:
    trace = build_trace(two_rank_run(), start=2.0, end=3.0)
    steps = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "step"]
    assert sorted({e["args"]["step"] for e in steps}) == list(range(9, 21))
    assert trace["otherData"]["window_start_s"] == 2.0
    with pytest.raises(WindowError, match="must be after"):
        build_trace(two_rank_run(), start=3.0, end=2.0)
    with pytest.raises(
        WindowError, match=r"--start 100 s is past the run's end: it spans 0-6\.0 s"
    ):
        build_trace(two_rank_run(), start=100.0)


def test_the_size_estimate_of_a_run_of_many_hosts_is_not_many_times_too_big(jittered_hosts):
    run = jittered_hosts(hosts=8, seconds=60.0)
    size = len(json.dumps(build_trace(run, max_mb=1000)).encode()) / 1e6
    build_trace(
        run, max_mb=2 * size
    )  # hosts that sample apart are not counted as sampling together
    with pytest.raises(TraceError, match="over the"):
        build_trace(run, max_mb=size / 4)


def test_a_trace_over_the_cap_is_refused_with_a_window_that_fits() -> None:
    with pytest.raises(TraceError) as err:
        build_trace(two_rank_run(), max_mb=0.01)
    message = str(err.value)
    assert "over the 0.01 MB cap" in message and "--start 0 --end" in message


def test_cli_trace_of_a_real_run_parses_with_every_step(run_profiled, tmp_path: Path) -> None:
    script = (
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n"
        "m = torch.nn.Linear(4, 2); o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for x, y in DataLoader(TensorDataset(torch.randn(96, 4), torch.randint(0, 2, (96,))), batch_size=8):\n"
        "    o.zero_grad(); torch.nn.functional.cross_entropy(m(x), y).backward(); o.step()\n"
    )
    cp, run_dir = run_profiled(script)
    assert cp.returncode == 0, cp.stderr
    out = tmp_path / "t.json"
    done = subprocess.run([sys.executable, "-m", "gpufeed.cli", "trace", str(run_dir), "-o", str(out)],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0 and "trace written to" in done.stdout, done.stderr
    events = json.loads(out.read_text())["traceEvents"]
    assert (
        len([e for e in events if e.get("cat") == "step"]) == len(gpufeed.load(run_dir).steps) == 12
    )
    assert any(e["ph"] == "C" and e["name"].startswith("cpu.core") for e in events)
    too_big = subprocess.run([sys.executable, "-m", "gpufeed.cli", "trace", str(run_dir), "--max-mb", "0.001"],
                             capture_output=True, text=True)  # fmt: skip
    assert (
        too_big.returncode == 2
        and "--start/--end" in too_big.stderr
        and "Traceback" not in too_big.stderr
    )


def test_step_spans_never_reach_into_the_next_step() -> None:
    run = two_rank_run(300)
    rng = np.random.default_rng(0)
    ends = T0 + 1 + np.cumsum(rng.uniform(0.01, 0.2, 300))  # back to back, sub-µs fractions
    for rank in (0, 1):
        rows = run.steps["rank"] == rank
        run.steps.loc[rows, "end"] = ends
        run.steps.loc[rows, "start"] = np.r_[T0 + 1, ends[:-1]]
    run.steps["duration"] = run.steps["end"] - run.steps["start"]
    run.meta["end_time"] = float(ends[-1])
    events = build_trace(run)["traceEvents"]
    for tid in (1, 2):
        spans = sorted(
            (e["ts"], e["dur"]) for e in events if e.get("cat") == "step" and e["tid"] == tid
        )
        ns = [(round(ts * 1e3), round(dur * 1e3)) for ts, dur in spans]
        assert len(ns) == 300
        assert all(a + d <= b for (a, d), (b, _) in itertools.pairwise(ns))
