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
        # from the medians, not the seconds per epoch rounded to 3 places (those drift by
        # more than 0.1 point where an epoch takes a few milliseconds)
        cpu, gpu = median("cpu", str(s["load"])), median("gpu", str(s["load"]))
        assert s["gpu_gain_pct"] == pytest.approx(100 * (1 - cpu / gpu), abs=0.06)
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
    # 32 images: the large batch is all of them, and the table says so (it said 64, which
    # never ran: every step got 32)
    assert [r["batch_size"] for r in rows] == ["4", "32"]
    assert "Only 32 images: the large batch is 32, not 64" in (out / "results.md").read_text()
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


TINY_ARGS = ["--images", "32", "--steps", "2", "--batch-size", "8", "--repeats", "1"]


def tiny_images(folder: Path, n: int = 8) -> Path:
    from gpufeed.demo.synth import make_image_folder

    return make_image_folder(folder, n, 2, short_side=(64, 80))


@pytest.mark.parametrize("data", ["an empty folder", "shards"])
def test_a_rerun_refused_for_bad_input_keeps_the_earlier_results(
    tmp_path: Path, cache: Path, data: str
) -> None:
    from gpufeed.data.packing import pack
    from gpufeed.errors import GpufeedError

    bad = tmp_path / "data"
    if data == "shards":  # `workers` packs images itself, resized and not
        pack(tiny_images(tmp_path / "images"), bad, progress=False)
    else:
        bad.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    earlier = {name: f"earlier {name}\n" for name in ("results.csv", "results.json", "results.md")}
    for name, text in earlier.items():
        (out / name).write_text(text)
    with pytest.raises(GpufeedError):
        run_bench("workers", out, full=False, cache=cache, data=bad, **TINY)
    assert {p.name: p.read_text() for p in out.iterdir()} == earlier


@pytest.mark.parametrize(
    ("option", "path", "says"),
    [
        ("--cache", "{tmp}/file", "is a file, not a folder"),
        ("--cache", "/proc/nope", "cannot write there"),
        ("--out", "/proc/nope", "cannot write there"),
    ],
)
def test_an_unusable_out_or_cache_is_one_line_naming_the_option(
    tmp_path: Path, cache: Path, option: str, path: str, says: str
) -> None:
    if path.startswith("/proc") and not Path("/proc/self").is_dir():
        pytest.skip("needs Linux /proc, a folder nothing can be created in")
    (tmp_path / "file").write_text("keep me")
    path = path.format(tmp=tmp_path)
    paths = {"--out": str(tmp_path / "out"), "--cache": str(cache), option: path}
    args = ["bench", "batch", *TINY_ARGS, "--out", paths["--out"], "--cache", paths["--cache"]]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gpufeed: error: {option} {path}")
    assert says in lines[0]
    assert (tmp_path / "file").read_text() == "keep me"


def test_files_of_data_that_are_not_images_are_named_in_the_results_and_on_screen(
    tmp_path: Path, cache: Path
) -> None:
    images = tiny_images(tmp_path / "mine", 32)
    good = images / "class_000" / "img_000000.jpg"
    (images / "class_000" / "broken.jpg").write_bytes(good.read_bytes()[:500])
    (images / "class_001" / "notes.txt").write_text("hi")
    args = ["bench", "batch", "--steps", "2", "--data", str(images), "--cache", str(cache)]
    for out in (tmp_path / "first", tmp_path / "again"):  # the second run reuses the pack
        result = CliRunner().invoke(app, [*args, "--out", str(out)])
        assert result.exit_code == 0, result.output
        warnings = [line for line in result.output.splitlines() if "gpufeed: warning" in line]
        assert len(warnings) == 1, warnings  # not Python 3.12's DeprecationWarning on fork
        warning = warnings[0]
        assert "2 files skipped" in warning and "broken.jpg" in warning and "notes.txt" in warning
        doc = json.loads((out / "results.json").read_text())
        assert doc["params"]["images"] == 32  # what --data holds, not the default to generate
        assert any("broken.jpg" in n and "notes.txt" in n for n in doc["notes"])
        assert "broken.jpg" in (out / "results.md").read_text()


def test_a_data_folder_that_changed_since_its_cached_pack_is_packed_again(
    tmp_path: Path, cache: Path
) -> None:
    images = tiny_images(tmp_path / "mine", 32)
    args = ["bench", "batch", "--steps", "2", "--data", str(images), "--cache", str(cache)]
    first = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "first")])
    assert first.exit_code == 0, first.output
    extra = images / "class_000" / "img_extra.jpg"
    extra.write_bytes((images / "class_000" / "img_000000.jpg").read_bytes())
    again = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "again")])
    assert again.exit_code == 0, again.output  # was: "exists from a different pack; use a new DST"
    assert json.loads((tmp_path / "again" / "results.json").read_text())["params"]["images"] == 33


def test_bench_workers_compares_one_worker_with_the_workers_option(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpufeed.bench import experiments

    used: list[int] = []

    def loader(cfg, data, *, workers=None, **kw):
        used.append(workers)

    def profiled(cfg, res, name, model, data, steps, batch_size):  # no training: only the grid
        return {"images_per_s": 1.0, "util_of": "cpu", "util_mean": 50.0, "rules_fired": "none"}

    monkeypatch.setattr(experiments, "make_loader", loader)
    monkeypatch.setattr(experiments, "_profiled", profiled)
    out = run_bench("workers", tmp_path / "w", full=False, cache=cache, **{**TINY, "workers": 3})
    assert used == [1, 3, 1, 3]
    assert [r["workers"] for r in read_rows(out)] == ["1", "3", "1", "3"]

    r = CliRunner().invoke(app, ["bench", "workers", "--workers", "1", "-o", str(tmp_path / "x")])
    assert r.exit_code == 2 and "--workers 1: `bench workers` compares 1 loader worker" in r.output
    assert not (tmp_path / "x").exists()


def test_a_batch_larger_than_the_data_is_refused_before_anything_runs(
    tmp_path: Path, cache: Path
) -> None:
    from gpufeed.bench.workload import BenchError

    with pytest.raises(BenchError, match=r"32 images .* fewer than one batch of 64"):
        run_bench("workers", tmp_path / "w", full=False, cache=cache, **{**TINY, "batch_size": 64})
    assert not (tmp_path / "w" / "results.json").exists()


def test_workers_below_one_is_refused_by_the_command_line_with_its_minimum(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["bench", "augload", "--workers", "0"])
    assert r.exit_code == 2 and "--workers 0: must be 1 or more" in r.output


def test_without_matplotlib_the_summary_names_only_the_files_written_and_drops_a_stale_chart(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    out = tmp_path / "out"
    out.mkdir()
    (out / "results.png").write_bytes(b"\x89PNG of an earlier run")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as without gpufeed[bench]
    args = ["bench", "batch", *TINY_ARGS, "--out", str(out), "--cache", str(cache)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "gpufeed: warning: no chart" in result.output
    assert f"gpufeed: wrote {out}/results.md (+ .csv, .json)" in result.output
    assert ".png" not in result.output and not (out / "results.png").exists()
