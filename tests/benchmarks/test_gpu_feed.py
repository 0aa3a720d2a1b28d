"""benchmarks/gpu_feed.py, issue 10's side-by-side table on a CUDA machine, run here in its --smoke
form (tiny sizes on a CPU), so the command a GPU session runs does not rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_feed.py"


@pytest.mark.slow
def test_smoke_run_measures_the_ceiling_and_says_why_each_other_row_did_not_run(tmp_path):
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        str(SCRIPT),
        "--smoke",
        "--cache",
        str(tmp_path / "c"),
        "--out",
        str(out),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]

    results = json.loads((out / "results.json").read_text())
    assert results["synthetic"]["rate"] > 0
    assert [name for name, r in results.items() if "error" in r] == []
    for name, r in results.items():  # every row measured, or skipped with its reason
        assert "rate" in r or r["skipped"], name
    measured = [name for name, r in results.items() if "rate" in r]
    table = (out / "results.md").read_text()
    assert all(f"| {name} | " in table for name in results)
    for name in measured:
        assert len(results[name]["first_waits_ms"]) == 2, name  # one per epoch


@pytest.mark.slow
def test_a_later_call_with_only_adds_its_rows_beside_the_earlier_ones(tmp_path):
    out = tmp_path / "out"
    common = [sys.executable, str(SCRIPT), "--smoke", "--cache", str(tmp_path / "c")]
    for only in ("synthetic", "nvJPEG"):  # the second row is skipped here: no CUDA
        cmd = [*common, "--out", str(out), "--only", only]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]

    results = json.loads((out / "results.json").read_text())
    assert results["synthetic"]["rate"] > 0  # kept from the first call
    assert list(results) == [
        "synthetic",
        "gpufeed GPU (nvJPEG) L=1",
        "loader alone: gpufeed GPU (nvJPEG) L=1",
    ]
    assert "| synthetic | " in (out / "results.md").read_text()


def test_only_that_matches_no_pipeline_is_a_clear_error_listing_the_names(tmp_path):
    cmd = [
        sys.executable,
        str(SCRIPT),
        "--smoke",
        "--only",
        "nosuch",
        "--cache",
        str(tmp_path / "c"),
    ]
    cmd += ["--out", str(tmp_path / "o")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert "--only nosuch: no pipeline name contains it" in done.stderr
    assert "synthetic; classic torchvision L=1" in done.stderr
    assert not (tmp_path / "o").exists() and not (tmp_path / "c").exists()  # refused first
