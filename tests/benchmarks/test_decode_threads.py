"""benchmarks/decode_threads.py, workers and decode threads side by side, run small so it does
not rot."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpufeed.data import jpeg_region

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "decode_threads.py"


def test_a_small_run_writes_every_setting_with_its_ratio_to_the_default(tmp_path):
    if not jpeg_region.one_pass_available():
        pytest.skip("no one native pass here")
    out = tmp_path / "threads.md"
    cmd = [sys.executable, str(SCRIPT), "--images", "192", "--rounds", "1"]
    cmd += ["--cache", str(tmp_path / "cache"), "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=SCRIPT.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in out.read_text().splitlines() if line.startswith("| ")]
    names = [r[0].strip() for r in rows[1:]]
    assert len(names) == 5 and names[0].endswith("(default, baseline)")
    assert any("no worker" in n for n in names) and any("1 worker" in n for n in names)
    for row in rows[1:]:
        assert float(row[1]) > 0 and float(row[3]) > 0 and row[4].strip().endswith("×")
    assert rows[1][4].strip() == "1.00×"
