"""benchmarks/gpu_verdicts.py, the one command that checks issue 11 on a CUDA machine, run here in
its --smoke form (tiny sizes on a CPU), a part at a time."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_verdicts.py"


@pytest.fixture(scope="module")
def gpu_verdicts() -> ModuleType:
    """The script as a module: its `main(argv)` is the command line, run in this process (its
    measurements still run in their own processes)."""
    spec = importlib.util.spec_from_file_location("gpu_verdicts", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def two_tests(folder: Path, failing: bool) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "test_two.py"
    path.write_text(
        f"def test_passes():\n    pass\n\n\ndef test_other():\n    assert {not failing}\n"
    )
    return path


def test_suite_part_records_the_summary_and_the_failing_test_ids(gpu_verdicts, tmp_path):
    tests = two_tests(tmp_path / "t", failing=True)
    out, cache = tmp_path / "out", tmp_path / "cache"
    gpu_verdicts.main(
        ["--smoke", "--only", "suite", "--out", str(out), "--cache", str(cache),
         "--suite-args", str(tests)]
    )  # fmt: skip

    suite = json.loads((out / "results.json").read_text())["parts"]["suite"]
    assert suite["summary"].startswith("1 failed, 1 passed")
    assert len(suite["failed"]) == 1 and suite["failed"][0].endswith("test_two.py::test_other")
    row = next(ln for ln in (out / "results.md").read_text().splitlines() if "test suite" in ln)
    assert "test_two.py::test_other" in row and "**NO**" in row
    assert "test_two.py::test_other" in (out / "log.txt").read_text()  # the whole output is kept
    assert not cache.exists()  # the suite alone needs no data set


@pytest.mark.slow
def test_a_later_call_adds_its_verdict_beside_the_earlier_parts(gpu_verdicts, tmp_path):
    out, cache = tmp_path / "out", tmp_path / "cache"
    tests = two_tests(tmp_path / "t", failing=False)
    common = ["--smoke", "--out", str(out), "--cache", str(cache)]
    gpu_verdicts.main([*common, "--only", "suite", "--suite-args", str(tests)])
    gpu_verdicts.main([*common, "--only", "diagnose"])

    doc = json.loads((out / "results.json").read_text())
    assert doc["parts"]["suite"]["summary"].startswith("2 passed")  # kept from the first call
    assert doc["parts"]["data"]["images"] == 48
    diagnosis = doc["parts"]["diagnose"]["full"]
    assert diagnosis["verdict"] in ("input-bound", "compute-bound")
    assert 0 < diagnosis["ceiling_share"] <= 1 and diagnosis["together_images_per_s"] > 0
    assert diagnosis["model"] == "resnet18" and diagnosis["batch_shape"][0] == 8
    table = (out / "results.md").read_text()
    assert f"| diagnose, full shards | {diagnosis['verdict']}" in table
    assert "| test suite | 2 passed" in table
    assert set(doc["durations"]) == {"suite", "data", "diagnose"}
    assert doc["hardware"]["torch"] == torch.__version__


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the full run is allowed")
def test_without_cuda_the_full_run_is_refused_in_one_line(gpu_verdicts, tmp_path):
    with pytest.raises(SystemExit) as e:
        gpu_verdicts.main(["--out", str(tmp_path / "out"), "--only", "suite"])
    assert e.value.code == (
        "gpu_verdicts.py: no CUDA GPU here; on a CPU run it with --smoke (tiny sizes)"
    )
    assert not (tmp_path / "out").exists()


def test_an_out_that_is_a_file_is_refused_by_name(gpu_verdicts, tmp_path, capsys):
    file = tmp_path / "taken"
    file.write_text("x")
    with pytest.raises(SystemExit) as e:
        gpu_verdicts.main(["--smoke", "--out", str(file)])
    assert e.value.code == 2
    assert f"--out {file} is a file: give a folder" in capsys.readouterr().err
    assert file.read_text() == "x"
