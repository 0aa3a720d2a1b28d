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
from gpufeed.demo.compare import DemoConfig, DemoResult, PipelineResult, demo_config, next_step


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
    with pytest.raises(ValueError, match="--batch-size must be at least 2, got 1"):
        demo_config(tiny=True, images=8, batch_size=1)  # BatchNorm refused it mid-training


def test_both_demo_pipelines_train_on_the_same_whole_batches(tmp_path: Path):
    # the gpufeed run kept each epoch's short last batch (the naive one dropped it): 9 images in
    # batches of 4 ended in a batch of 1, which BatchNorm refuses at 16-32 px
    import argparse

    from gpufeed.demo.compare import demo_images, demo_shards
    from gpufeed.demo.train import build_loader

    cfg = replace(demo_config(tiny=True), images=9, classes=2, short_side=(64, 80), batch_size=4)
    images = demo_images(tmp_path, cfg)
    common = {"batch_size": 4, "workers": 0, "image_size": 16, "prefetch": 1}
    sizes = {}
    for pipeline, data in (("naive", images), ("gpufeed", demo_shards(images, cfg))):
        args = argparse.Namespace(pipeline=pipeline, data=str(data), preprocess="cpu", **common)
        loader = build_loader(args)
        sizes[pipeline] = [len(labels) for _, labels in loader]
        getattr(loader, "close", lambda: None)()
    assert sizes["naive"] == sizes["gpufeed"] == [4, 4]


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


def _tiny() -> DemoConfig:
    return replace(demo_config(tiny=True), images=8, classes=2, short_side=(64, 80), batch_size=2)


def test_a_renamed_work_dir_reuses_its_images_and_packs_its_shards_again(tmp_path: Path):
    from gpufeed.data.dataset import ShardDataset
    from gpufeed.demo.compare import demo_images, demo_shards

    cfg = _tiny()
    demo_shards(demo_images(tmp_path / "before", cfg), cfg)
    (tmp_path / "before").rename(tmp_path / "after")  # the pack still names the old paths
    shards = demo_shards(demo_images(tmp_path / "after", cfg), cfg)
    assert shards.parent.parent == tmp_path / "after"
    assert len(ShardDataset(str(shards), shuffle=False)) == 8


def test_an_out_that_is_not_valid_utf8_is_refused_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from typer.testing import CliRunner

    from gpufeed.cli import app
    from gpufeed.demo import compare

    ran: list[object] = []
    monkeypatch.setattr(compare, "run_demo", lambda *a, **k: ran.append(a))
    result = CliRunner().invoke(app, ["demo", "--tiny", "--out", f"{tmp_path}/work\udcff"])
    assert result.exit_code == 2
    assert f"--out {tmp_path}/work\\xff: not valid UTF-8" in result.output
    assert ran == [] and list(tmp_path.iterdir()) == []


def _no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpufeed.demo import compare

    def fail(*args, **kwargs):
        raise AssertionError("the demo started its work")

    monkeypatch.setattr(compare, "demo_images", fail)
    monkeypatch.setattr(compare, "profile_training", fail)


def test_a_non_empty_out_the_demo_did_not_make_is_refused_and_left_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from gpufeed.demo.compare import run_demo

    _no_training(monkeypatch)
    work = tmp_path / "project"
    (work / "logs").mkdir(parents=True)
    (work / "logs" / "naive.log").write_text("my training log")
    with pytest.raises(ValueError, match="holds files gpufeed demo does not make: give an"):
        run_demo(_tiny(), work, progress=False)
    assert [p.name for p in work.rglob("*")] == ["logs", "naive.log"]
    assert (work / "logs" / "naive.log").read_text() == "my training log"


def test_the_demo_runs_again_in_its_own_work_dir_and_in_one_it_finished_before_its_marker(
    tmp_path: Path,
):
    from gpufeed.demo.compare import claim_work_dir

    work = tmp_path / "gpufeed-demo"
    claim_work_dir(work)  # a new folder (`make demo`, the first time)
    for name in ("logs/naive.log", "runs/naive-1/meta.json", "data/images-8x2-64-80/a.jpg"):
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text("made by the demo")
    claim_work_dir(work)  # `make demo` again
    former = tmp_path / "older"  # a demo finished in it before the marker was written
    for name in ("logs/naive.log", "demo-result.json"):
        (former / name).parent.mkdir(parents=True, exist_ok=True)
        (former / name).write_text("{}")
    claim_work_dir(former)
    stopped = tmp_path / "stopped"  # one stopped (out of memory) before it wrote its result
    for name in ("data/images-8x2-64-80/a.jpg", "logs/naive.log"):
        (stopped / name).parent.mkdir(parents=True, exist_ok=True)
        (stopped / name).write_text("made by the demo")
    claim_work_dir(stopped)
    (tmp_path / "empty").mkdir()
    claim_work_dir(tmp_path / "empty")


def test_an_image_size_that_cannot_fit_in_memory_is_refused_up_front():
    with pytest.raises(ValueError, match="--batch-size 128 --image-size 60000: one batch"):
        demo_config(tiny=True, image_size=60000)


def test_a_training_run_killed_by_the_system_is_said_to_be_probably_out_of_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    import sys

    from gpufeed.demo import compare

    suicide = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"  # as the OOM killer does
    monkeypatch.setattr(compare, "train_command", lambda *a: [sys.executable, "-c", suicide])
    with pytest.raises(compare.DemoError) as e:
        compare.profile_training("naive", tmp_path, _tiny(), tmp_path / "work")
    assert "exit code 137 - it was killed, probably out of memory" in str(e.value)
    assert "use a smaller --image-size or --batch-size" in str(e.value)


def test_report_paths_stay_whole_on_one_line_when_output_is_a_pipe(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    from gpufeed.cli import echo_result

    monkeypatch.delenv("COLUMNS", raising=False)  # not a terminal: rich makes lines 80 wide
    result = _result(0.03, [])
    deep = Path("/home/someone/a-rather-long-project-folder-name/experiments/gpufeed-demo/runs")
    result.naive.report = deep / "naive-20261125-015839-c086d6" / "report.html"
    result.gpufeed.report = deep / "gpufeed-20261125-015901-a33322" / "report.html"
    echo_result(result)
    lines = capsys.readouterr().out.splitlines()
    for report in (result.naive.report, result.gpufeed.report):
        assert any(str(report) in line for line in lines), lines
