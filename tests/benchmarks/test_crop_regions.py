"""benchmarks/crop_regions.py, the crop-box decode against the default decoder, run small so it
does not rot."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "crop_regions.py"


def test_a_small_run_writes_both_decoders_with_their_ratio(tmp_path):
    pytest.importorskip("nvidia.nvimgcodec")
    out = tmp_path / "regions.md"
    cmd = [sys.executable, str(SCRIPT), "--images", "256", "--loads", "1", "--rounds", "1"]
    cmd += ["--cache", str(tmp_path / "cache"), "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in out.read_text().splitlines() if line.startswith("| ")]
    assert [r[1].strip() for r in rows[1:]] == ["default (whole image)", "nvimgcodec (crop box)"]
    for row in rows[1:]:
        assert float(row[2]) > 0 and float(row[6]) > 0 and row[7].strip().endswith("×")
