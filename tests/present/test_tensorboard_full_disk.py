"""`gpufeed export --tensorboard` onto a disk that fills up half-way: one clear error line naming
the output folder and the OS reason, a non-zero exit, no traceback, and nothing left behind that
could pass for a complete export."""

from __future__ import annotations

import errno
import os
import resource
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("tensorboard")

STEPS = 1500  # about 5 scalars of ~50 bytes per step and rank: ~0.4 MB per event file


@pytest.fixture
def big_run(make_run) -> Path:
    """A run whose event files come to far more than the space the tests leave."""
    rows = [(s, 1000.0 + 0.05 * s, 1000.05 + 0.05 * s, 0.01, 32.0, None) for s in range(STEPS)]
    return make_run(host="node-a", ranks={0: rows, 1: rows})


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 64 KiB tmpfs (needs root: CI runs as root); skipped where it cannot be mounted."""
    if os.geteuid() != 0:
        pytest.skip("mounting a 64 KiB tmpfs needs root (CI runs as root)")
    mount = tmp_path / "small"
    mount.mkdir()
    cp = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if cp.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {cp.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _files(folder: Path) -> list[str]:
    return sorted(str(Path(d, f)) for d, _, names in os.walk(folder) for f in names)


def _assert_clean_failure(cp: subprocess.CompletedProcess, out: Path, reason: str) -> None:
    assert cp.returncode != 0, cp.stdout
    assert "Traceback" not in cp.stderr and "Exception in thread" not in cp.stderr, cp.stderr
    lines = [line for line in cp.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, cp.stderr
    assert lines[0].startswith("gpufeed: error: "), cp.stderr
    assert str(out) in lines[0] and reason in lines[0], cp.stderr
    assert "None" not in lines[0], cp.stderr
    assert "TensorBoard events written" not in cp.stdout


def test_full_tmpfs_is_one_error_line_and_leaves_nothing(big_run, full_disk, gpufeed_cli):
    out = full_disk / "tb"
    cp = subprocess.run(
        gpufeed_cli("export", str(big_run), "--tensorboard", str(out)),
        capture_output=True,
        text=True,
        timeout=180,
    )
    _assert_clean_failure(cp, out, os.strerror(errno.ENOSPC))
    assert _files(full_disk) == []  # no half-written event file, no staging folder
    assert not (out / big_run.name).exists()


def _limit_file_size() -> None:
    # 256 KiB: room for SQLite's read of the run (its -shm file), not for the event files
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG


def test_file_size_limit_is_one_error_line_and_leaves_nothing(big_run, tmp_path, gpufeed_cli):
    """The same on any machine, root or not: RLIMIT_FSIZE makes a write fail half-way (EFBIG)."""
    out = tmp_path / "tb"
    cp = subprocess.run(
        gpufeed_cli("export", str(big_run), "--tensorboard", str(out)),
        capture_output=True,
        text=True,
        timeout=180,
        preexec_fn=_limit_file_size,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    _assert_clean_failure(cp, out, os.strerror(errno.EFBIG))
    assert not out.exists() or _files(out) == []
    assert not (out / big_run.name).exists()
