"""benchmarks/crop_regions.py, the crop-box decoders against whole-image decodes, run small so it
does not rot."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpufeed.data import jpeg_region

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "crop_regions.py"


def test_a_small_run_writes_every_decoder_with_its_ratio_to_whole_decodes(tmp_path):
    if not jpeg_region.available():
        pytest.skip("gpufeed was installed without its crop-region decoder")
    try:
        import nvidia.nvimgcodec  # noqa: F401

        names = [
            "whole image (baseline)",
            "crop regions (jpeg_region, default)",
            "nvimgcodec (crop box)",
        ]
    except ImportError:
        names = ["whole image (baseline)", "crop regions (jpeg_region, default)"]
    out = tmp_path / "regions.md"
    cmd = [sys.executable, str(SCRIPT), "--images", "256", "--loads", "1", "--rounds", "1"]
    cmd += ["--cache", str(tmp_path / "cache"), "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in out.read_text().splitlines() if line.startswith("| ")]
    assert [r[1].strip() for r in rows[1:]] == names
    for row in rows[1:]:
        assert float(row[2]) > 0 and float(row[6]) > 0 and row[7].strip().endswith("×")
