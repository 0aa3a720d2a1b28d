"""Atomic writes: a reader never sees half a file, and what the path names is never destroyed:
a symlink keeps pointing at its (rewritten) target, a FIFO or device is written into."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from gpufeed.atomic import write_atomic


def test_a_file_is_replaced_whole_and_no_temporary_file_is_left(tmp_path: Path):
    target = tmp_path / "report.json"
    target.write_text("old")
    write_atomic(target, "new")
    assert target.read_text() == "new" and os.listdir(tmp_path) == ["report.json"]


def test_a_symlink_is_written_through_and_kept(tmp_path: Path):
    (tmp_path / "real").mkdir()
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "real" / "f.json")
    write_atomic(link, "{}")
    assert link.is_symlink() and (tmp_path / "real" / "f.json").read_text() == "{}"


def test_a_fifo_is_written_into_not_replaced(tmp_path: Path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    write_atomic(fifo, "findings")
    reader.join(timeout=60)
    assert got == [b"findings"] and not fifo.is_file() and fifo.is_fifo()


def test_dev_null_stays_a_device():
    if not os.path.exists(os.devnull):
        pytest.skip("no /dev/null")
    write_atomic(os.devnull, "x")
    assert not Path(os.devnull).is_file()
