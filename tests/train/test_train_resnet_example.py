"""examples/train_resnet.py: the plain user script trains from an image folder, also under the profiler."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gpufeed
from gpufeed.data.shards import has_index
from gpufeed.demo.synth import make_image_folder

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_resnet.py"


def test_trains_from_an_image_folder_under_gpufeed_profile(tmp_path: Path, run_profiled) -> None:
    folder = make_image_folder(tmp_path / "images", 24, 3, short_side=(48, 64))
    args = ["--data", str(folder), "--model", "resnet18", "--image-size", "32", "--batch-size", "8"]
    args += ["--steps", "3", "--workers", "1", "--pack-dir", str(tmp_path / "packs")]
    proc, run_dir = run_profiled(EXAMPLE, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resnet18:" in proc.stdout and "images/s over 3 steps" in proc.stdout
    assert has_index(tmp_path / "packs" / "images")
    steps = gpufeed.load(run_dir).steps
    assert len(steps) == 3
    assert set(steps["samples"]) == {8}


def test_a_missing_data_folder_is_named(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        str(EXAMPLE),
        "--data",
        str(tmp_path / "nope"),
        "--pack-dir",
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert f"--data {tmp_path / 'nope'}: no such directory" in proc.stderr
