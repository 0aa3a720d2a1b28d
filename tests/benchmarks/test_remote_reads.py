"""benchmarks/remote_reads.py, bytes asked of S3 per epoch, run small so it does not rot."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "remote_reads.py"


def test_each_byte_is_asked_once_and_a_cached_epoch_asks_for_none(tmp_path):
    out = tmp_path / "reads.md"
    cmd = [sys.executable, str(SCRIPT), "--images", "96", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in out.read_text().splitlines() if line.startswith("| ")]
    rows = [[c.strip() for c in r] for r in rows[1:]]
    assert len(rows) == 12
    for cache, _, _, first, second in rows:
        if cache == "False":
            assert first == "1.00x"  # no read-ahead past a run's last sample
        else:
            assert float(first[:-1]) >= 1.0 and second == "0.00x"
