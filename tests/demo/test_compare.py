"""`gpufeed demo --tiny`: the naive run is profiled and diagnosed, the gpufeed run is faster, and
both HTML reports exist. Runs the real command line end to end (two profiled training runs)."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from gpufeed.data.shards import INDEX_NAME
from gpufeed.demo.compare import DemoResult, PipelineResult, demo_config, next_step


@pytest.mark.slow
def test_tiny_demo_runs_end_to_end_and_gpufeed_beats_the_naive_pipeline(
    tmp_path: Path, gpufeed_cli
):
    work = tmp_path / "demo"
    cp = subprocess.run(
        gpufeed_cli("demo", "--tiny", "--out", str(work)),
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        env={**os.environ, "COLUMNS": "300"},  # no line wrapping of the report paths
    )
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-3000:]
    out = cp.stdout
    assert "Findings for the naive run" in out
    assert "Before / after (measured)" in out
    assert "speedup ×" in out

    result = json.loads((work / "demo-result.json").read_text())
    naive, fed = result["naive"], result["gpufeed"]
    # the naive run's bottleneck is named, with its numbers
    rules = {f["rule"]: f for f in naive["findings"]}
    assert "DataLoaderBottleneck" in rules, naive["findings"]
    assert rules["DataLoaderBottleneck"]["evidence"]["data_wait_share"] >= 0.2
    assert naive["data_wait_share"] > fed["data_wait_share"]
    # same work in both runs, and the measured speedup is real
    assert naive["steps"] == fed["steps"] == result["config"]["steps"]
    assert fed["images_per_s"] > naive["images_per_s"], result
    assert result["speedup"] == pytest.approx(fed["images_per_s"] / naive["images_per_s"])
    for r in (naive, fed):
        report = Path(r["report"])
        assert report.is_file() and report.stat().st_size > 10_000
        assert str(report) in out
    # the data set is generated once and reused by the next run
    assert len(list((work / "data").glob("images-*/*/*.jpg"))) == result["config"]["images"]


def test_bad_options_are_refused_by_name():
    with pytest.raises(ValueError, match="--model 'resnet9' is not known"):
        demo_config(model="resnet9")
    with pytest.raises(ValueError, match="--steps must be at least 8"):
        demo_config(tiny=True, steps=2)
    with pytest.raises(ValueError, match="--images 40 is too few for --batch-size 32"):
        demo_config(tiny=True, images=40, batch_size=32)


def test_bad_model_on_the_command_line_exits_2_with_a_clear_message(tmp_path: Path, gpufeed_cli):
    cp = subprocess.run(
        gpufeed_cli("demo", "--tiny", "--model", "vgg", "--out", str(tmp_path / "d")),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cp.returncode == 2
    assert "--model 'vgg' is not known" in cp.stderr and "Traceback" not in cp.stderr


def test_the_data_set_is_generated_once_and_reused(tmp_path: Path):
    from gpufeed.demo.compare import demo_images, demo_shards

    cfg = replace(demo_config(tiny=True), images=8, classes=2, short_side=(64, 80), batch_size=2)
    seen: list[int] = []
    first = demo_images(tmp_path, cfg, on_images=seen.append)
    assert seen[-1] == 8 and len(list(first.glob("*/*.jpg"))) == 8
    stamps = {p: p.stat().st_mtime_ns for p in first.glob("*/*.jpg")}
    shards = demo_shards(first, cfg)
    index = (shards / INDEX_NAME).stat().st_mtime_ns
    again = demo_images(tmp_path, cfg)
    assert again == first
    assert {p: p.stat().st_mtime_ns for p in again.glob("*/*.jpg")} == stamps
    assert (demo_shards(again, cfg) / INDEX_NAME).stat().st_mtime_ns == index


def _result(wait: float, findings: list[dict]) -> DemoResult:
    def run(name: str, rate: float, share: float, found: list[dict]) -> PipelineResult:
        return PipelineResult(name, Path(name), Path(f"{name}.html"), rate, rate, share, 90.0, 5.0,
                              40, 3, found)  # fmt: skip

    cfg = demo_config(tiny=True)
    return DemoResult(cfg, run("naive", 100.0, 0.7, []), run("gpufeed", 300.0, wait, findings))


def test_demo_says_when_the_after_run_is_still_input_bound_and_what_to_do_next():
    advice = {"rule": "DataLoaderBottleneck", "recommendation": "Set num_workers=15 (now 7)."}
    still = _result(0.36, [{"rule": "StepOutlier", "recommendation": "look"}, advice])
    assert still.after_input_bound
    text = next_step(still)
    assert "still input-bound" in text and "36%" in text and "GPU 5% busy" in text
    assert text.endswith("Set num_workers=15 (now 7).")
    assert json.loads(still.to_json())["after_input_bound"] is True
    fed = _result(0.03, [])
    assert not fed.after_input_bound and "no longer input-bound" in next_step(fed)


def test_a_demo_result_prints_itself_with_rich():
    """What `gpufeed demo` prints at the end is the returned DemoResult, rendered by itself."""
    from rich.console import Console

    result = _result(0.03, [])
    result.naive.findings = [
        {"rule": "DataLoaderBottleneck", "severity": "critical", "title": "Data [wait]",
         "evidence": {"data_wait_share": 0.7}, "recommendation": "Set num_workers=7."}
    ]  # fmt: skip
    console = Console(record=True, width=200)
    console.print(result, crop=False)
    out = console.export_text()
    assert "Findings for the naive run" in out and "Data [wait]" in out
    assert "data_wait_share=0.7" in out and "Set num_workers=7." in out
    assert "Before / after (measured)" in out and "speedup ×3.00" in out
    assert "no longer input-bound" in out and "naive.html" in out and "gpufeed.html" in out
