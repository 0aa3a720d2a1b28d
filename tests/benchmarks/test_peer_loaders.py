"""benchmarks/peer_loaders.py, gpufeed beside the peer loaders, run small so it does not rot: the
loaders that are installed get a measured row, the peers that are not are named with their pip
line instead of crashing the run."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "peer_loaders.py"
PEER_MODULES = {"spdl": "spdl.io", "torchdata": "torchdata.nodes", "litdata": "litdata"}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _rows(text: str, heading: str) -> dict[str, list[str]]:
    """The table under `## heading`, as {loader: cells}."""
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:-1] for line in section.splitlines() if line.startswith("| ")]
    return {r[0].strip(): [c.strip() for c in r[1:]] for r in rows[1:]}


def test_a_small_run_measures_gpufeed_and_the_dataloader_and_names_missing_peers(tmp_path):
    missing = [k for k, module in PEER_MODULES.items() if not _installed(module)]
    out = tmp_path / "peers.md"
    cmd = [sys.executable, str(SCRIPT), "--images", "64", "--rounds", "1"]
    cmd += ["--loaders", ",".join(["gpufeed", "dataloader", *missing])]
    cmd += ["--cache", str(tmp_path / "cache"), "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    text = out.read_text()
    assert "Hardware: " in text and "Load (`uptime`) before: " in text
    for variant in ("full", "256"):
        rows = _rows(text, f"Variant {variant}")
        for name in ("gpufeed Loader", "DataLoader + Pillow"):
            rate, cpu_ms, share, _, vs_classic, _ = rows[name]
            assert float(rate) > 0 and float(cpu_ms) > 0, rows[name]
            assert share.endswith("%") and vs_classic.endswith("×"), rows[name]
        assert rows["DataLoader + Pillow"][4] == "1.00×"
        assert rows["gpufeed Loader"][3] == "–"  # DALI, the baseline, was not asked for
        for key in missing:
            status = next(cells[0] for name, cells in rows.items() if key in name.lower())
            assert status.startswith("not installed") and "pip install" in status, status
        assert "Decode-only limit" in text
