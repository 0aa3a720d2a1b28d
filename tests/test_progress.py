"""The one progress reporter: where stderr is a log (a file or a pipe), a plain line per 10% of
the work with its rate; switched off, nothing; the reader of the log gone, the work goes on."""

from __future__ import annotations

import subprocess
import sys
import textwrap

WORK = textwrap.dedent(
    """
    import sys
    from gpufeed.progress import reporting
    total, unit = int(sys.argv[1]), sys.argv[2]
    done, step = int(sys.argv[4]), max(1, total // 1000)
    with reporting(sys.argv[3] == "on", total, "working", unit=unit, done=done) as advance:
        for _ in range((total - done) // step):
            advance(step)
    print("done")
    """
)


def _run(total: int, unit: str, on: bool = True, done: int = 0) -> subprocess.CompletedProcess:
    argv = [str(total), unit, "on" if on else "off", str(done)]
    return subprocess.run(
        [sys.executable, "-c", WORK, *argv], capture_output=True, text=True, timeout=120
    )


def test_a_log_gets_a_line_per_tenth_of_the_items_with_the_rate():
    cp = _run(1000, "images")
    lines = cp.stderr.splitlines()
    assert cp.returncode == 0 and cp.stdout == "done\n", cp.stderr
    assert len(lines) == 10, lines
    assert lines[0].startswith("working: 100/1,000 images (10%), ") and "images/s" in lines[0]
    assert "left" in lines[0] and "left" not in lines[-1]
    assert lines[-1].startswith("working: 1,000/1,000 images (100%)")


def test_bytes_are_counted_in_megabytes_and_work_done_before_is_counted_in():
    cp = _run(50_000_000, "bytes", done=25_000_000)
    lines = cp.stderr.splitlines()
    assert lines[0].startswith("working: 30.0/50.0 MB (60%), ") and "MB/s" in lines[0], lines
    assert len(lines) == 5 and lines[-1].startswith("working: 50.0/50.0 MB (100%)")


def test_switched_off_it_says_nothing():
    cp = _run(1000, "images", on=False)
    assert cp.returncode == 0 and cp.stderr == "" and cp.stdout == "done\n"


def test_a_log_reader_that_leaves_stops_the_lines_not_the_work():
    script = "import os; os.close(2)\n" + WORK
    argv = ["1000", "images", "on", "0"]
    cp = subprocess.run(
        [sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=120
    )
    assert cp.returncode == 0 and cp.stdout == "done\n"
