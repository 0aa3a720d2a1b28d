"""`gpufeed trace RUN --merge KINETO.json`: gpufeed's tracks inside a real torch.profiler trace, on its
time axis."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gpufeed.present.kineto import PID_BASE

# A plain CPU training loop that records steps 10-14 with torch.profiler, as a user would.
TRAIN = """
import sys, time, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0); torch.set_num_threads(1)
model = nn.Sequential(nn.Flatten(), nn.Linear(48, 32), nn.ReLU(), nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = DataLoader(TensorDataset(torch.randn(640, 3, 4, 4), torch.randint(0, 4, (640,))), batch_size=16)
schedule = torch.profiler.schedule(wait=8, warmup=2, active=5, repeat=1)
def done(prof):
    prof.export_chrome_trace(sys.argv[1])
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=schedule,
                            on_trace_ready=done) as prof:
    for x, y in data:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        time.sleep(0.01)
        opt.step()
        prof.step()
"""

_CACHE: dict[str, Path] = {}


@pytest.fixture
def profiled(run_profiled, tmp_path: Path) -> dict[str, Path]:
    """A real run under `gpufeed profile` and the Kineto trace its script exported."""
    if not _CACHE:
        kineto = tmp_path / "kineto.json"
        cp, run_dir = run_profiled(TRAIN, str(kineto))
        assert cp.returncode == 0 and run_dir is not None, cp.stderr[-2000:]
        assert kineto.exists(), cp.stderr[-2000:]
        _CACHE.update(run=run_dir, kineto=kineto)
    return _CACHE


def _merge(gpufeed_cli, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(gpufeed_cli("trace", *args), capture_output=True, text=True, timeout=120)


def test_gpufeed_steps_frame_the_profilers_optimizer_steps(profiled, gpufeed_cli, tmp_path):
    out = tmp_path / "merged.json"
    cp = _merge(
        gpufeed_cli, str(profiled["run"]), "--merge", str(profiled["kineto"]), "-o", str(out)
    )
    assert cp.returncode == 0, cp.stderr
    kineto = json.loads(profiled["kineto"].read_text())
    merged = json.loads(out.read_text())
    assert merged["baseTimeNanoseconds"] == kineto["baseTimeNanoseconds"]
    assert merged["traceEvents"][: len(kineto["traceEvents"])] == kineto["traceEvents"]
    ours = merged["traceEvents"][len(kineto["traceEvents"]) :]
    assert ours and all(e["pid"] >= PID_BASE for e in ours)
    assert any(
        e["name"] == "process_name" and e["args"]["name"].startswith("gpufeed: ") for e in ours
    )
    assert any(e["ph"] == "C" and e["name"].startswith("cpu.") for e in ours)
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in ours if e.get("cat") == "step")
    optimizer = [
        (e["ts"], e["ts"] + e["dur"])
        for e in kineto["traceEvents"]
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("Optimizer.step#")
    ]
    assert len(optimizer) == 5
    # Each optimizer step the profiler saw lies inside one of gpufeed's step spans: the two clocks
    # agree to well under a step (10 ms of sleep each); 1 ms allows for clock-reading jitter.
    for a, b in optimizer:
        assert any(s - 1e3 <= a and b <= e + 1e3 for s, e in steps), (a, b)
    # ... and that step ends with it: gpufeed ends a step in optimizer.step's hook (tens of µs
    # before the profiler closes its span).
    ends = [min(e for _, e in steps if e >= b - 1e3) for _, b in optimizer]
    assert all(abs(e - b) < 1e3 for e, (_, b) in zip(ends, optimizer, strict=True))


def test_a_trace_of_another_time_or_not_a_trace_is_refused(profiled, gpufeed_cli, tmp_path):
    kineto = json.loads(profiled["kineto"].read_text())
    kineto["baseTimeNanoseconds"] -= 86_400 * 10**9  # a day earlier
    old = tmp_path / "old.json"
    old.write_text(json.dumps(kineto))
    cp = _merge(gpufeed_cli, str(profiled["run"]), "--merge", str(old))
    assert cp.returncode == 2 and "outside the run" in cp.stderr and "Traceback" not in cp.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    cp = _merge(gpufeed_cli, str(profiled["run"]), "--merge", str(bad))
    assert cp.returncode == 2 and "bad.json is not a JSON trace" in cp.stderr
    cp = _merge(gpufeed_cli, str(profiled["run"]), "--merge", str(tmp_path / "missing.json"))
    assert cp.returncode == 2 and "no such file" in cp.stderr
