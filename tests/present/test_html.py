"""The HTML report: self-contained, opens in real headless Chromium without errors, escapes the run's
strings, stays small for a 24-hour run, and `gpufeed report` writes it (also while the run goes on)."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.offline
import pytest

import gpufeed
from gpufeed.analysis.finding import Finding
from gpufeed.analysis.result import Analysis, analyze_run
from gpufeed.analysis.rules import RULES
from gpufeed.analysis.run import Run
from gpufeed.present.html import render_html

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM = (
    shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium not installed (`make chromium` installs Debian's)"
)
XSS = "<script>alert(1)</script>"


def _analysis(run: Run, findings: list[Finding] | None = None) -> Analysis:
    """`run` analyzed as the commands do; `findings` given: those shown instead of the rules'."""
    result = analyze_run(run)
    return result if findings is None else dataclasses.replace(result, findings=findings)


# Two seconds of an input-bound loop: one worker sleeping 64 ms per batch against ~10 ms of step
# work (data-wait share ~0.8, far above the 0.1 threshold even on a loaded machine), so the report
# has a finding.
SCRIPT = """
import time, torch
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self): return 256
    def __getitem__(self, i):
        time.sleep(0.008)
        return torch.randn(16), i % 2
model = torch.nn.Linear(16, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in DataLoader(Slow(), batch_size=8, num_workers=1):
    opt.zero_grad(); torch.nn.functional.cross_entropy(model(x), y).backward(); opt.step()
    time.sleep(0.01)
"""


@pytest.fixture(scope="module")
def profiled(tmp_path_factory) -> Path:
    """A real run named like an XSS payload, profiled once for this module."""
    out = tmp_path_factory.mktemp("runs")
    cmd = [sys.executable, "-m", "gpufeed.cli", "profile", "--out", str(out), "--interval", "0.1"]
    cmd += ["--name", XSS, "--", sys.executable, "-c", SCRIPT]
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert cp.returncode == 0, cp.stderr
    return Path(re.search(r"profiling into (.+)", cp.stderr).group(1).strip())


def chromium(url: str, *flags: str) -> str:
    """Run headless Chromium on `url` with a fresh profile; return what it printed to stdout."""
    with tempfile.TemporaryDirectory() as profile:
        cp = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--virtual-time-budget=15000", *flags, url],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert cp.returncode == 0, cp.stderr[-2000:]
    return cp.stdout


@needs_chromium
def test_report_renders_in_chromium_without_errors_and_escapes_the_name(profiled: Path) -> None:
    report = profiled / "report.html"
    cp = subprocess.run(
        [sys.executable, "-m", "gpufeed.cli", "report", str(profiled)],
        capture_output=True,
        text=True,
    )
    assert cp.returncode == 0 and f"report written to {report}" in cp.stdout, cp.stderr
    dom = chromium(report.as_uri(), "--dump-dom")
    figures = json.loads(
        re.search(r'id="chart-data">(.*?)</script>', report.read_text(), re.S).group(1)
    )
    assert re.search(r'<pre id="js-errors"></pre>', dom), re.search(r"js-errors.{0,500}", dom)
    assert f'data-charts-rendered="{len(figures)}"' in dom
    assert {"chart-cpu-cores", "chart-util-steps", "chart-step-breakdown", "chart-step-hist",
            "chart-roles"} <= set(figures)  # fmt: skip
    starts = sorted((dom.index(f'id="{chart}"'), chart) for chart in figures)
    for (start, chart), (end, _) in zip(starts, [*starts[1:], (len(dom), "")], strict=True):
        assert "main-svg" in dom[start:end], f"{chart} did not render"  # plotly's SVG is inside
    # The name is text in the page, never markup: no alert script was injected anywhere.
    assert '<span id="run-name">&lt;script&gt;alert(1)&lt;/script&gt;</span>' in dom
    assert XSS not in dom and "alert(1)</script>" not in report.read_text()
    assert "DataLoaderBottleneck" in dom and "estimated speedup" in dom, cp.stdout
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report.png"
    chromium(report.as_uri(), f"--screenshot={shot}", "--window-size=1400,3200")
    assert shot.stat().st_size > 20_000


def test_report_is_self_contained(profiled: Path, tmp_path: Path) -> None:
    run = gpufeed.load(profiled)
    html = render_html(run, _analysis(run, []))
    assert not re.search(r"""<(script|link|img)[^>]+(src|href)=["']?(https?:)?//""", html)
    assert "No bottleneck found" in html  # no findings passed: the healthy message


def test_the_data_wait_card_says_the_training_thread_slept_on_its_worker(profiled: Path) -> None:
    run = gpufeed.load(profiled)
    html = render_html(run, _analysis(run, []))
    # the one worker sleeps 64 ms a batch; the training thread waits for it, off the CPU
    assert re.search(
        r"the training thread was on a CPU \d+% of it \(asleep on loader workers", html
    )


def test_cli_writes_json_findings_and_rejects_bad_options(profiled: Path, tmp_path: Path) -> None:
    out, js = tmp_path / "r.html", tmp_path / "f.json"
    cli = [sys.executable, "-m", "gpufeed.cli", "report", str(profiled), "-o", str(out)]
    cp = subprocess.run([*cli, "--json", str(js)], capture_output=True, text=True)
    assert cp.returncode == 0, cp.stderr
    data = json.loads(js.read_text())
    assert data["name"] == XSS and data["finished"] is True
    assert data["healthy"] is False, data["findings"]
    assert data["findings"][0]["rule"] == "DataLoaderBottleneck", data["findings"]
    cp = subprocess.run([*cli, "--set", "DataLoaderBottleneck.enabled=false", "--json", str(js)],
                        capture_output=True, text=True)  # fmt: skip
    assert "DataLoaderBottleneck" not in {f["rule"] for f in json.loads(js.read_text())["findings"]}
    cp = subprocess.run(
        [*cli, "--set", "DataLoaderBottleneck.treshold=1"], capture_output=True, text=True
    )
    assert cp.returncode == 2 and "unknown parameter DataLoaderBottleneck.treshold" in cp.stderr
    cp = subprocess.run([*cli[:4], str(tmp_path / "nope")], capture_output=True, text=True)
    assert cp.returncode == 2 and "is not a directory" in cp.stderr and "Traceback" not in cp.stderr
    bad = tmp_path / "gpufeed.toml"
    bad.write_text("[rules.Nope]\nx = 1\n")
    cp = subprocess.run([*cli, "--config", str(bad)], capture_output=True, text=True)
    assert cp.returncode == 2 and "gpufeed.toml: unknown rule 'Nope'" in cp.stderr


def test_watch_rewrites_the_report_until_the_run_ends(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    script = tmp_path / "train.py"
    script.write_text(SCRIPT + "\ntime.sleep(2)\n")
    prof = subprocess.Popen(
        [sys.executable, "-m", "gpufeed.cli", "profile", "--out", str(runs), "--interval", "0.1",
         "--", sys.executable, str(script)],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.time() + 60
        while not any(runs.glob("*/meta.json")) and time.time() < deadline:
            time.sleep(0.1)
        run_dir = next(runs.glob("*/meta.json")).parent
        watch = subprocess.run(
            [sys.executable, "-m", "gpufeed.cli", "report", str(run_dir), "--watch", "0.5"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        prof.wait(timeout=120)
    assert watch.returncode == 0, watch.stderr
    lines = watch.stdout.splitlines()
    assert len(lines) >= 2 and "run still in progress" in lines[0]
    assert "in progress" not in lines[-1]  # the last rewrite saw the finished run, then it stopped
    assert "run still in progress" not in (run_dir / "report.html").read_text()


def big_run(hours: float = 24, interval: float = 0.2, cores: int = 4) -> Run:
    """A synthetic day-long run at the default interval: one GPU, `cores` cores, 4 workers."""
    t = 1_700_000_000 + np.arange(0, hours * 3600, interval)
    n = len(t)
    rng = np.random.default_rng(0)
    series = [("cpu.util", ""), ("cpu.iowait", ""), ("mem.used", ""), ("mem.total", ""),
              ("disk.read", ""), ("net.rx", ""), ("gpu.util", "0"), ("gpu.mem_used", "0"),
              ("gpu.mem_total", "0")] + [("cpu.core", str(c)) for c in range(cores)]  # fmt: skip
    system = pd.DataFrame(
        {
            "time": np.tile(t, len(series)),
            "host": pd.Categorical(["node0"] * (n * len(series))),
            "metric": pd.Categorical(np.repeat([m for m, _ in series], n)),
            "device": pd.Categorical(np.repeat([d for _, d in series], n)),
            "value": rng.uniform(0, 100, n * len(series)),
        }
    )
    d = 0.5 + 0.01 * rng.standard_normal(int(hours * 3600 / 0.5))
    end = t[0] + 5 + np.cumsum(d)
    steps = pd.DataFrame(
        {"host": "node0", "rank": 0, "local_rank": 0, "pid": 1000, "step": np.arange(len(d)),
         "start": end - d, "end": end, "duration": d, "data_wait": 0.01 * d, "samples": 256.0,
         "gpu_time": np.nan}
    )  # fmt: skip
    pt = t[::5]
    processes = pd.DataFrame(
        {"time": np.tile(pt, 3), "host": "node0", "pid": np.repeat([1000, 2000, 2001], len(pt)),
         "role": np.repeat(["main", "worker", "worker"], len(pt)), "cpu": 50.0, "rss": 2e9}
    )  # fmt: skip
    meta = {"name": "day", "command": ["python", "train.py"], "start_time": t[0], "end_time": t[-1],
            "exit_code": 0, "interval": interval, "hosts": ["node0"], "cpu_count": cores,
            "gpus": [{"index": 0, "name": "NVIDIA H100", "memory_total": 8e10}], "ranks": [],
            "finished": True}  # fmt: skip
    return Run(Path("day"), meta, system, steps, processes)


@pytest.mark.slow
def test_a_24_hour_run_gives_a_report_under_10_mb() -> None:
    run = big_run()
    html = render_html(run, _analysis(run))
    size = len(html.encode())
    assert size < 10e6, f"{size / 1e6:.1f} MB"
    # plotly.js (inlined for offline use, and said so) stays the only large part.
    own = size - len(plotly.offline.get_plotlyjs().encode())
    assert own < 2e6, f"{own / 1e6:.1f} MB besides plotly.js"
    assert re.search(r"works offline: plotly\.js [\d.]+ is inlined \([\d.]+ MB\)", html)
    # Every series was binned: no chart carries more points than the cap.
    figures = json.loads(re.search(r'id="chart-data">(.*?)</script>', html, re.S).group(1))
    longest = max(len(tr.get("x") or []) for f in figures.values() for tr in f["data"])
    assert 100 < longest <= 1200


@needs_chromium
def test_a_gpu_report_says_what_utilization_means_and_lists_every_rule(tmp_path: Path) -> None:
    run = big_run(hours=0.1)
    findings = gpufeed.analyze(run)
    report = tmp_path / "report.html"
    report.write_text(render_html(run, _analysis(run)))
    dom = chromium(report.as_uri(), "--dump-dom")
    assert re.search(r'<pre id="js-errors"></pre>', dom), re.search(r"js-errors.{0,500}", dom)
    # The heatmap's title (plotly's SVG text) says what NVML measures, and nothing claims "SM %".
    assert "GPUs over time: busy, % of time a kernel was running" in dom
    assert "SM utilization" not in dom
    # Every rule is listed with its verdict, also those that passed.
    verdicts = dict(
        re.findall(
            r"<td>(\w+)</td><td[^>]*>[^<]*</td>\s*<td><span class=\"verdict \w+\">(\w+)<", dom
        )
    )
    assert set(verdicts) == set(RULES)
    fired = {f.rule: f.severity for f in findings}
    assert verdicts == {rid: fired.get(rid, "passed") for rid in RULES}
    # The step-time line has a point per step, no holes, drawn connected over utilization.
    figures = json.loads(re.search(r'id="chart-data">(.*?)</script>', dom, re.S).group(1))
    _, step = figures["chart-util-steps"]["data"]
    assert step["yaxis"] == "y2" and step["connectgaps"] is True
    assert len(step["y"]) == len(run.steps) and None not in step["y"]
    assert "works offline: plotly.js" in dom
    shot = tmp_path / "report-gpu.png"
    chromium(report.as_uri(), f"--screenshot={shot}", "--window-size=1400,3600")
    assert shot.stat().st_size > 20_000
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copyfile(shot, ARTIFACTS / shot.name)


def test_charts_of_hosts_that_sample_at_different_moments_have_no_holes(jittered_hosts) -> None:
    run = jittered_hosts(hosts=2)
    html = render_html(run, _analysis(run, []))
    figures = json.loads(re.search(r'id="chart-data">(.*?)</script>', html, re.S).group(1))
    cores = figures["chart-cpu-cores"]["data"][0]["z"]
    memory = figures["chart-memory"]["data"]
    (main,) = figures["chart-roles"]["data"]
    for series in [*cores, *(m["y"] for m in memory), main["y"]]:
        assert None not in series[1:]  # the first bin may come before a host's first sample
    # the two hosts' training processes add up: 2 × 95% of a core
    assert np.median(main["y"][1:]) == pytest.approx(1.9)
    assert main["stackgaps"] == "interpolate"  # an empty bin is never drawn as 0 cores


def test_every_core_of_every_host_has_its_own_row_label(jittered_hosts) -> None:
    run = jittered_hosts(hosts=8)
    figure = json.loads(
        re.search(
            r'id="chart-data">(.*?)</script>', render_html(run, _analysis(run, [])), re.S
        ).group(1)
    )
    layout = figure["chart-cpu-cores"]["layout"]
    assert len(figure["chart-cpu-cores"]["data"][0]["y"]) == 32
    assert layout["yaxis"]["dtick"] == 1 and layout["yaxis"]["automargin"] is True
    assert layout["height"] >= 18 * 32


def test_a_run_of_hosts_with_different_cores_names_each_hosts_cores() -> None:
    run = big_run(hours=0.05)
    run.meta |= {
        "hosts": ["node0", "node1"],
        "cpu_count": 4,
        "host_cpu_counts": {"node0": 4, "node1": 2},
    }
    html = render_html(run, _analysis(run, []))
    assert "4 + 2 cores (" in html  # the header
    assert re.search(r"p95 [\d.]+% of 4 \+ 2 cores", html)  # the CPU card


def test_the_data_wait_card_adds_the_share_after_the_warm_up_the_findings_skip(
    make_run, tmp_path: Path
) -> None:
    from gpufeed.commands.report import write_report

    # 5 warm-up steps wait 0.9 of their 1 s, the 15 after them 0.1: 30% over all, 10% after
    steps = {0: [(i, 1010.0 + i, 1011.0 + i, 0.9 if i < 5 else 0.1, 16.0, None) for i in range(20)]}
    run = make_run(ranks=steps)
    page = write_report(run, tmp_path / "r.html", echo=lambda _: None).read_text()
    text = " ".join(re.sub(r"<[^>]+>", " ", page).split())
    assert "30.0% of step time (wait / whole step), every step; 10.0% after the 5 warm-up" in text
    config = tmp_path / "warm.toml"
    config.write_text("[rules.warmup]\nsteps = 0\nseconds = 0\n")
    page = write_report(run, tmp_path / "r.html", config=config, echo=lambda _: None).read_text()
    assert "every step;" not in page
