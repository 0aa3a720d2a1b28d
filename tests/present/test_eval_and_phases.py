"""Evaluation passes and per-step phases in the HTML report and the Perfetto trace, from a real
profiled script with a validation loop: evaluation apart from training, phases nested in each step,
"unknown" (never 0%) where data wait was not measured."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_html import chromium, needs_chromium

import gpufeed
from gpufeed.analysis.finding import Finding
from gpufeed.analysis.result import Analysis, analyze_run
from gpufeed.analysis.run import Run
from gpufeed.analysis.stats import step_summary
from gpufeed.analysis.timeline import timeline, window
from gpufeed.present import trace as present_trace
from gpufeed.present.html import render_html


def build_trace(run: Run, **options: Any) -> dict[str, Any]:
    """The trace of `run` as `gpufeed trace` builds it: from its `Timeline`."""
    return present_trace.build_trace(
        run,
        window(run, timeline(run), options.pop("start", None), options.pop("end", None)),
        **options,
    )


def _analysis(run: Run, findings: list[Finding] | None = None) -> Analysis:
    """`run` analyzed as the commands do; `findings` given: those shown instead of the rules'."""
    result = analyze_run(run)
    return result if findings is None else dataclasses.replace(result, findings=findings)


SCENARIO = Path(__file__).resolve().parents[1] / "scenarios" / "eval_loop.py"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """eval_loop.py ("plain": 4 epochs of 13 training steps, a 4-batch validation pass after each)."""
    out = tmp_path_factory.mktemp("runs")
    cmd = [sys.executable, "-m", "gpufeed.cli", "profile", "--out", str(out), "--interval", "0.1"]
    cp = subprocess.run(
        [*cmd, "--", sys.executable, str(SCENARIO), "plain"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert cp.returncode == 0, cp.stderr[-2000:]
    return Path(re.search(r"profiling into (.+)", cp.stderr).group(1).strip())


def _figures(page: str) -> dict:
    return json.loads(re.search(r'id="chart-data">(.*?)</script>', page, re.S).group(1))


def test_trace_puts_evaluation_on_its_own_track_and_nests_phases_in_steps(run_dir: Path) -> None:
    run = gpufeed.load(run_dir)
    trace = build_trace(run)
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    threads = {
        e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"
    }
    evals = [e for e in spans if e["name"] == "evaluation"]
    assert len(evals) == 4 and {threads[e["tid"]] for e in evals} == {"rank 0 evaluation"}
    assert all(e["args"]["batches"] == 4 and e["args"]["samples"] == 128 for e in evals)
    info = trace["otherData"]
    assert info["evaluation_passes"] == 4
    assert info["evaluation_s"] == pytest.approx(float(run.evals["duration"].sum()), abs=2e-3)
    assert info["training_steps_s"] == pytest.approx(float(run.steps["duration"].sum()), abs=2e-3)

    steps = [e for e in spans if e["cat"] == "step"]
    assert len(steps) == len(run.steps) == 52
    for ev in evals:  # no training step spans a validation pass
        assert not any(
            s["ts"] <= ev["ts"] and s["ts"] + s["dur"] >= ev["ts"] + ev["dur"] for s in steps
        )
    for name in ("data wait", "forward", "backward", "optimizer"):
        nested = [e for e in spans if e["name"] == name]
        assert len(nested) >= 40, name
        for e in nested:  # each phase lies inside one step of its track
            assert any(
                s["tid"] == e["tid"]
                and s["ts"] <= e["ts"]
                and e["ts"] + e["dur"] <= s["ts"] + s["dur"] + 1e-3
                for s in steps
            ), (name, e)
    assert all("forward_ms" in s["args"] for s in steps[1:])
    waits = [e for e in spans if e["name"] == "data wait"]  # with the training thread's CPU
    assert all(0 <= e["args"]["cpu_ms"] <= e["dur"] / 1e3 + 1 for e in waits)
    if Path("/proc/thread-self/schedstat").exists():  # and its time ready for a core, on Linux
        assert all(0 <= e["args"]["ready_ms"] <= e["dur"] / 1e3 + 1 for e in waits)

    unknown = dataclasses.replace(run, steps=run.steps.assign(data_wait=np.nan))
    spans = [e for e in build_trace(unknown)["traceEvents"] if e["ph"] == "X"]
    assert not any(e["name"] == "data wait" for e in spans)
    assert all(e["args"]["data_wait_ms"] == "unknown" for e in spans if e["cat"] == "step")


def test_report_shows_evaluation_apart_and_each_phase_of_a_step(run_dir: Path) -> None:
    run = gpufeed.load(run_dir)
    page = render_html(run, _analysis(run))
    s = step_summary(run)
    card = re.search(
        r'<div class="k">Evaluation</div><div class="v">([^<]+)</div>\s*<div class="d">([^<]+)',
        page,
    )
    value, unit = card.group(1).split()
    shown = float(value) * (1e-3 if unit == "ms" else 1.0)  # ms below a second: "11.3 ms"
    assert unit in ("s", "ms") and shown == pytest.approx(
        s["eval_time"], abs=0.05 if unit == "s" else 5e-5
    )
    assert "4 passes" in card.group(2)
    table = re.search(r'<table id="step-phases">(.*?)</table>', page, re.S).group(1)
    for phase in ("data wait", "forward", "backward", "optimizer", "other"):
        assert re.search(rf"<td>{phase}</td><td>\d+\.\d%</td><td>[\d.]+ ms</td>", table), phase
    figs = _figures(page)
    bars = {t["name"]: t["y"] for t in figs["chart-step-breakdown"]["data"]}
    assert set(bars) == {
        "data wait, training thread busy, ms",  # measured: the part of the wait it worked
        "data wait, ms",
        "forward, ms",
        "backward, ms",
        "optimizer, ms",
        "other, ms",
    }
    on_cpu = np.array(bars["data wait, training thread busy, ms"], dtype=float)
    waits = 1e3 * run.steps.sort_values("step")["data_wait"].to_numpy(dtype=float)
    assert np.allclose(on_cpu + np.array(bars["data wait, ms"], dtype=float), waits, rtol=1e-2)
    bands = figs["chart-util-steps"]["layout"]["shapes"]
    assert len(bands) == 4 and all(b["x1"] > b["x0"] for b in bands)

    unknown = dataclasses.replace(run, steps=run.steps.assign(data_wait=np.nan))
    page = render_html(unknown, _analysis(unknown))
    assert re.search(r'<div class="k">Data wait</div><div class="v">unknown</div>', page)
    table = re.search(r'<table id="step-phases">(.*?)</table>', page, re.S).group(1)
    assert "<td>data wait</td><td>unknown</td><td>unknown</td>" in table
    assert "0.0%" not in re.search(r"Data wait.{0,200}", page, re.S).group(0)
    note = re.search(r'id="chart-step-breakdown"></div>\s*<div class="note">([^<]+)', page).group(1)
    assert "data wait unknown for 52 of 52 steps" in note
    bars = {t["name"] for t in _figures(page)["chart-step-breakdown"]["data"]}
    assert "data wait, training thread busy, ms" not in bars  # no split of an unknown wait


@needs_chromium
def test_report_with_evaluation_renders_in_chromium(run_dir: Path) -> None:
    cp = subprocess.run(
        [sys.executable, "-m", "gpufeed.cli", "report", str(run_dir)],
        capture_output=True,
        text=True,
    )
    assert cp.returncode == 0, cp.stderr
    report = run_dir / "report.html"
    dom = chromium(report.as_uri(), "--dump-dom")
    assert '<pre id="js-errors"></pre>' in dom, re.search(r"js-errors.{0,500}", dom)
    assert f'data-charts-rendered="{len(_figures(report.read_text()))}"' in dom
    assert '<table id="step-phases">' in dom and ">Evaluation<" in dom
    breakdown = dom[dom.index('id="chart-step-breakdown"') :]
    assert "main-svg" in breakdown[:200_000] and "forward, ms" in breakdown[:200_000]


def test_report_and_show_use_the_gpu_clock_for_the_model_phases_where_it_was_measured(
    run_dir: Path,
) -> None:
    from rich.console import Console

    from gpufeed.present.terminal import print_run

    run = gpufeed.load(run_dir)
    host = Console(record=True, width=200)
    print_run(run, _analysis(run, []), host)
    assert "Step phases (host time): data wait" in host.export_text()

    # As a CUDA run records them: GPU work between events, here a fixed 1, 2 and 0.5 ms per step.
    gpu = run.steps.assign(gpu_forward=1e-3, gpu_backward=2e-3, gpu_optimizer=0.5e-3)
    on_gpu = dataclasses.replace(run, steps=gpu)
    s = step_summary(on_gpu)
    assert s["phase_clock"] == "cuda"
    timed = gpu[np.isfinite(gpu["duration"])]
    assert s["backward_share"] == pytest.approx(2e-3 * len(timed) / timed["duration"].sum())
    page = render_html(on_gpu, _analysis(on_gpu, []))
    table = re.search(r'<table id="step-phases">(.*?)</table>', page, re.S).group(1)
    assert "<td>forward (GPU)</td>" in table and "<td>2.00 ms</td>" in table
    assert "<td>data wait</td>" in table  # the wait is the host's, as before
    title = _figures(page)["chart-step-breakdown"]["layout"]["title"]
    assert "GPU time from CUDA events" in json.dumps(title)
    console = Console(record=True, width=200)
    print_run(on_gpu, _analysis(on_gpu, []), console)
    assert "Step phases (GPU time from CUDA events): data wait" in console.export_text()
