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


@pytest.mark.parametrize(
    ("events", "says"),
    [
        (
            [{"ph": "X", "name": "aten::mm", "ts": "abc", "dur": 1}],
            "traceEvents[0] ('aten::mm') has 'ts': 'abc'",
        ),
        (
            [{"ph": "X", "name": "mm", "ts": 5, "dur": 1}, {"ph": "X", "name": "mm", "ts": 1e300}],
            "traceEvents[1] ('mm') has 'ts': 1e+300",
        ),
        ([{"ph": "X", "name": "mm", "ts": 5, "dur": float("inf")}], "has 'dur': inf"),
        ([{"ph": "i", "name": "mm", "ts": None}], "has 'ts': None"),
    ],
)
def test_an_event_whose_time_is_not_a_number_is_named_with_its_field(
    tmp_path: Path, events: list, says: str
):
    from gpufeed.present.kineto import KinetoError, read_kineto

    path = tmp_path / "k5.json"
    path.write_text(
        json.dumps({"baseTimeNanoseconds": 1_700_000_000 * 10**9, "traceEvents": events})
    )
    with pytest.raises(KinetoError, match="not a time in microseconds") as caught:
        read_kineto(path)
    assert str(caught.value).startswith(f"--merge {path}: ") and says in str(caught.value)


def test_a_base_time_that_is_not_a_number_is_named(tmp_path: Path):
    from gpufeed.present.kineto import KinetoError, read_kineto

    path = tmp_path / "k.json"
    path.write_text(json.dumps({"baseTimeNanoseconds": "soon", "traceEvents": []}))
    with pytest.raises(KinetoError, match=r"k.json: baseTimeNanoseconds is 'soon'"):
        read_kineto(path)


def test_a_trace_span_no_calendar_holds_is_still_a_readable_refusal():
    from gpufeed.present.kineto import KinetoError, merge_window

    kineto = {"traceEvents": [{"ph": "X", "name": "mm", "ts": 1e300, "dur": 1}]}  # never read
    with pytest.raises(KinetoError, match=r"spans 1e\+294 s Unix time.*outside the run"):
        merge_window(kineto, 1000.0, 1100.0, None, None)


def test_a_nan_in_the_kineto_trace_is_written_as_null_never_as_invalid_json(make_run, tmp_path):
    from gpufeed.commands.trace import write_trace

    run_dir = make_run(ranks={0: [(i, 1010.0 + i, 1011.0 + i, 0.1, 8.0, None) for i in range(5)]})
    kineto = tmp_path / "k.json"
    event = {"ph": "X", "name": "aten::mm", "ts": 10e6, "dur": 5e5, "args": {"flops": "NaN"}}
    kineto.write_text(
        json.dumps({"baseTimeNanoseconds": 1000 * 10**9, "traceEvents": [event]}).replace(
            '"NaN"', "NaN"
        )  # as a hand-edited or foreign trace may hold it: Python's reader accepts it
    )
    out = write_trace(run_dir, tmp_path / "m.json", merge=kineto, echo=lambda _: None)
    doc = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert doc["traceEvents"][0]["args"] == {"flops": None}
    assert any(e.get("cat") == "step" for e in doc["traceEvents"])
