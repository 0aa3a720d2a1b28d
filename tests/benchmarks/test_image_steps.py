"""benchmarks/image_steps.py, a worker's CPU per image step by step, run small so it does not rot."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpufeed.data import jpeg_region

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "image_steps.py"


def test_a_small_run_times_every_step_for_both_variants_with_the_ratio(tmp_path):
    if not jpeg_region.available():
        pytest.skip("gpufeed was installed without its crop-region decoder")
    out = tmp_path / "steps.md"
    cmd = [sys.executable, str(SCRIPT), "--images", "32", "--rounds", "1"]
    cmd += ["--cache", str(tmp_path / "cache"), "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=SCRIPT.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in out.read_text().splitlines() if line.startswith("| ")]
    names = [r[0].strip() for r in rows[1:]]
    assert names[:3] == [
        "build_batch, whole JPEGs (baseline)",
        "build_batch, crop regions, steps image by image",
        "build_batch, one native pass",
    ]
    assert "decode, crop region" in names
    assert names[-2:] == [
        "build_batch: whole ÷ crop regions, steps image by image",
        "build_batch: whole ÷ one native pass",
    ]
    for row in rows[1:-2]:
        assert all(float(cell.split()[0]) > 0 for cell in row[1:])
    assert all(cell.strip().endswith("×") for row in rows[-2:] for cell in row[1:])
