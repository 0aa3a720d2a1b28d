"""benchmarks/worker_cost.py, the workers' CPU per image by hand-off, run small so it does not rot."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "worker_cost.py"


def test_a_small_run_writes_one_row_per_load_with_both_figures(tmp_path):
    out = tmp_path / "cost.md"
    cmd = [sys.executable, str(SCRIPT), "--images", "16", "--loads", "1", "3", "--repeats", "1"]
    done = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in out.read_text().splitlines() if line.startswith("| ")]
    assert [r[0].strip() for r in rows[1:]] == ["1", "3"]
    for _, cpu_path, workers, ratio in rows[1:]:
        assert float(cpu_path) > 0 and float(workers) > 0 and ratio.strip().endswith("×")
