"""`gpufeed bench`: the reduced grids run end to end on tiny data and write their tables and plots."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufeed.bench.experiments import run_bench
from gpufeed.cli import app
from gpufeed.cores import usable_cores

TINY = {"images": 32, "steps": 2, "batch_size": 8, "repeats": 1, "progress": False}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bench-cache")


def read_rows(out: Path) -> list[dict[str, str]]:
    with open(out / "results.csv") as f:
        return list(csv.DictReader(f))


def test_reduced_augload_grid_runs_end_to_end_and_writes_its_table(
    tmp_path: Path, cache: Path
) -> None:
    out = run_bench(
        "augload", tmp_path / "augload", full=False, cache=cache, **{**TINY, "repeats": 2}
    )
    doc = json.loads((out / "results.json").read_text())
    assert doc["complete"] is True
    assert doc["hardware"]["cpu_cores"] >= 1 and doc["hardware"]["cpu_model"]
    assert "torch" in doc["hardware"]["versions"]
    rows = read_rows(out)  # every measurement, the grid twice, interleaved
    grid = [("synthetic", "")] + [
        (mode, str(load)) for load in (1, 4, 8, 12) for mode in ("cpu", "gpu")
    ]
    assert [(r["repeat"], r["preprocess"], r["load"]) for r in rows] == [
        (str(rep), mode, load) for rep in (0, 1) for mode, load in grid
    ]
    ips = {(r["repeat"], r["preprocess"], r["load"]): float(r["images_per_s"]) for r in rows}

    def median(mode: str, load: str) -> float:
        return (ips[("0", mode, load)] + ips[("1", mode, load)]) / 2  # the median of two

    summary = doc["summary"]
    assert [s["load"] for s in summary] == [1, 4, 8, 12]
    ceiling = median("synthetic", "")
    for s in summary:
        for mode in ("cpu", "gpu"):
            med = median(mode, str(s["load"]))
            assert s[f"{mode}_ips"] == pytest.approx(med)
            assert s[f"{mode}_efficiency"] == pytest.approx(med / ceiling, abs=1e-3)
            assert s[f"{mode}_epoch_s"] == pytest.approx(32 / med, rel=1e-3)
        cpu, gpu = s["cpu_epoch_s"], s["gpu_epoch_s"]
        assert s["gpu_gain_pct"] == pytest.approx(100 * (cpu - gpu) / cpu, abs=0.1)
        assert s["repeats"] == 2

    md = (out / "results.md").read_text()
    assert "| model | load L | cpu s/epoch | gpu s/epoch |" in md
    assert md.count("| resnet18 |") == 4
    assert "Reduced grid" in md and "Hardware:" in md
    assert (out / "summary.csv").read_text().count("\n") == 5
    assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_spent_time_budget_stops_the_grid_and_says_so(tmp_path: Path, cache: Path) -> None:
    out = run_bench("augload", tmp_path / "a", full=False, cache=cache, budget_s=1e-6, **TINY)
    doc = json.loads((out / "results.json").read_text())
    assert doc["complete"] is False
    assert doc["rows"] == []
    assert any("Time budget of 1e-06 s reached: 0 of 9" in n for n in doc["notes"])


def test_a_failing_configuration_is_recorded_and_the_grid_goes_on(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpufeed.bench import experiments

    real = experiments.make_loader

    def out_of_memory_at_load_8(cfg, data, *, preprocess="cpu", load=1, **kw):
        if preprocess == "gpu" and load == 8:  # what a too-large batch does on a real GPU
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\n(details)")
        return real(cfg, data, preprocess=preprocess, load=load, **kw)

    monkeypatch.setattr(experiments, "AUG_LOADS", (1, 8))
    monkeypatch.setattr(experiments, "make_loader", out_of_memory_at_load_8)
    out = run_bench("augload", tmp_path / "oom", full=False, cache=cache, **TINY)
    doc = json.loads((out / "results.json").read_text())
    assert doc["complete"] is True and len(doc["rows"]) == 5
    failed = [r for r in doc["rows"] if r.get("error")]
    assert [(r["preprocess"], r["load"], r["error"]) for r in failed] == [
        ("gpu", 8, "RuntimeError")
    ]
    assert any("gpu L=8 failed: CUDA out of memory" in n for n in doc["notes"])
    by_load = {s["load"]: s for s in doc["summary"]}
    assert by_load[8]["gpu_ips"] is None and by_load[8]["cpu_ips"] > 0
    assert "| resnet18 | 8 |" in (out / "results.md").read_text()


def test_workers_runs_each_configuration_under_the_profiler(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # a relative --out, as a user types it
    out = tmp_path / run_bench("workers", Path("w"), full=False, cache=cache, **TINY)
    rows = read_rows(out)
    many = str(max(2, usable_cores() - 1))
    assert [(r["data"].split()[0], r["workers"]) for r in rows] == [
        ("resize", "1"), ("resize", many), ("pre-resized", "1"), ("pre-resized", many),
    ]  # fmt: skip
    for r in rows:
        assert (out / r["run"] / "meta.json").is_file()
        assert r["util_of"] in ("cpu", "gpu") and 0 <= float(r["util_mean"]) <= 100
        assert float(r["images_per_s"]) > 0
    assert rows[0]["speedup"] == "1.0"
    assert "| images | workers | img/s |" in (out / "results.md").read_text()


def test_batch_reports_whether_the_batch_size_rule_fires(tmp_path: Path, cache: Path) -> None:
    import torch

    out = run_bench("batch", tmp_path / "b", full=False, cache=cache, **TINY)
    rows = read_rows(out)
    assert [r["batch_size"] for r in rows] == ["4", "64"]
    assert all(r["batchsize_rule"] in ("fires", "silent") for r in rows)
    if not torch.cuda.is_available():  # the rule reads GPU utilization and memory
        assert all(r["batchsize_rule"] == "silent" for r in rows)
        assert "stays silent on a CPU-only machine" in (out / "results.md").read_text()


def test_cli_names_unknown_experiments_and_bad_options(tmp_path: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(app, ["bench", "warp"])
    assert r.exit_code == 2 and "unknown experiment 'warp'" in r.output
    r = runner.invoke(app, ["bench", "augload", "--steps", "0"])
    assert r.exit_code == 2 and "--steps 0: must be 1 or more" in r.output
    r = runner.invoke(app, ["bench", "augload", "--data", str(tmp_path / "missing")])
    assert r.exit_code == 2 and "no such directory" in r.output


def test_bench_help_lists_the_experiments() -> None:
    r = CliRunner().invoke(app, ["bench", "--help"])
    assert r.exit_code == 0
    assert all(name in r.output for name in ("augload", "workers", "batch"))


@pytest.mark.parametrize("where", ["file", "file/inside"])
def test_an_out_that_is_or_lies_under_a_file_is_refused_before_anything_runs(
    tmp_path: Path, where: str
):
    (tmp_path / "file").write_text("keep me")
    result = CliRunner().invoke(app, ["bench", "workers", "-o", str(tmp_path / where)])
    assert result.exit_code == 2
    out = result.output.replace("\n", "")
    assert f"--out {tmp_path / where}" in out and "not a folder" in out
    assert (tmp_path / "file").read_text() == "keep me"
