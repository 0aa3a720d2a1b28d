"""Atomic writes: a reader never sees half a file, and what the path names is never destroyed:
a symlink keeps pointing at its (rewritten) target, a FIFO or device is written into."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
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


def test_dev_stdout_on_a_pipe_is_written_into():
    code = "from gpufeed.atomic import write_atomic; write_atomic('/dev/stdout', 'findings')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "findings"


def test_dev_stdout_redirected_to_a_file_is_written_at_its_offset_never_replaced(tmp_path: Path):
    log = tmp_path / "findings.log"
    log.write_text("earlier\n")
    code = (
        "from gpufeed.atomic import write_atomic\n"
        "print('before', flush=True)\n"
        "write_atomic('/dev/stdout', 'findings\\n')\n"
        "print('after')\n"
    )
    with open(log, "a") as out:  # the shell's `>> findings.log`
        subprocess.run([sys.executable, "-c", code], stdout=out, check=True, timeout=120)
    assert log.read_text() == "earlier\nbefore\nfindings\nafter\n"


def test_a_pipe_whose_reader_left_is_an_error_naming_the_path_given():
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        with pytest.raises(BrokenPipeError) as error:
            write_atomic(f"/dev/fd/{write_end}", "findings")
        assert error.value.filename == f"/dev/fd/{write_end}"
    finally:
        os.close(write_end)


def test_a_failed_write_names_the_file_asked_for(tmp_path: Path):
    # a full disk raised an error naming no file, a failed rename named the hidden temporary one
    with pytest.raises(OSError) as err:
        write_atomic("/dev/full", "x" * 10_000)
    assert err.value.filename == "/dev/full" and err.value.errno == errno.ENOSPC
    (tmp_path / "report.html").mkdir()
    with pytest.raises(OSError) as err:
        write_atomic(tmp_path / "report.html", "<html>")
    assert err.value.filename == str(tmp_path / "report.html")
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]  # no temporary file left
