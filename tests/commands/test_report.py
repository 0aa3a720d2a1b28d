"""`gpufeed report`: every output path is checked before anything is written, the JSON is strict,
and `--watch` stops by itself on a run whose profiler was killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from gpufeed.cli import app

runner = CliRunner()
STEPS = {0: [(i, 1010.0 + i, 1011.0 + i, 0.8, 8.0, None) for i in range(40)]}


def test_an_output_under_a_file_is_refused_before_any_file_is_written(make_run, tmp_path):
    run_dir = make_run(ranks=STEPS)
    script = tmp_path / "train_small.py"
    script.write_text("print('hi')\n")
    html = tmp_path / "ok1.html"
    res = runner.invoke(
        app, ["report", str(run_dir), "--json", f"{script}/f.json", "-o", str(html)]
    )
    assert res.exit_code == 2
    assert f"--json {script}/f.json: {script} is a file, not a folder" in res.stderr
    assert not html.exists() and script.read_text() == "print('hi')\n"


def test_an_output_that_is_a_folder_or_named_twice_is_refused(make_run, tmp_path):
    run_dir = make_run(ranks=STEPS)
    res = runner.invoke(app, ["report", str(run_dir), "-o", str(tmp_path)])
    assert res.exit_code == 2
    assert (
        f"--out {tmp_path} is a folder: give a file name in it, e.g. --out {tmp_path}/report.html"
        in res.stderr
    )
    same = tmp_path / "r.html"
    res = runner.invoke(app, ["report", str(run_dir), "-o", str(same), "--json", str(same)])
    assert res.exit_code == 2 and f"--out and --json both name {same}" in res.stderr
    assert not same.exists() and not (run_dir / "report.html").exists()
    default = run_dir / "report.html"  # --json naming the report's default file
    res = runner.invoke(app, ["report", str(run_dir), "--json", str(default)])
    assert res.exit_code == 2 and f"the report (--out) and --json both name {default}" in res.stderr
    assert not default.exists()


@pytest.mark.parametrize(
    ("command", "option"), [("report", "-o"), ("report", "--json"), ("trace", "-o")]
)
def test_an_output_naming_the_runs_own_data_is_refused_and_the_run_stays_readable(
    make_run, command, option
):
    # `-o RUN/steps-….db` (a tab completion too far) wrote over the store: the run was lost
    run_dir = make_run(ranks=STEPS)
    stores = sorted(run_dir.glob("*.db"))
    for target in [*stores, run_dir / "meta.json", run_dir / f"{stores[0].name}-wal"]:
        before = target.read_bytes() if target.exists() else None
        res = runner.invoke(app, [command, str(run_dir), option, str(target)])
        assert res.exit_code == 2, (target, res.output)
        assert f"{target} is a file of the run recorded in {run_dir}: writing it would " in (
            res.stderr
        )
        assert (target.read_bytes() if target.exists() else None) == before
    assert runner.invoke(app, ["show", str(run_dir)]).exit_code == 0


def test_json_findings_are_strict_json_also_without_a_system_store(make_run, tmp_path):
    run_dir = make_run(ranks=STEPS)
    for db in run_dir.glob("system-*.db"):
        db.unlink()  # no CPU samples: what they would tell is not measured, not NaN
    out = tmp_path / "f.json"
    res = runner.invoke(app, ["report", str(run_dir), "--json", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert doc["findings"], "the 80% data wait is found without system samples too"


def test_watch_stops_on_an_unfinished_run_that_records_nothing_any_more(make_run):
    run_dir = make_run(meta={"end_time": None, "exit_code": None}, ranks=STEPS)  # from 1970
    res = runner.invoke(app, ["report", str(run_dir), "--watch", "0.2"])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0] == f"gpufeed: report written to {run_dir / 'report.html'}"
    assert lines[1].startswith(f"gpufeed: stopped watching: {run_dir} never finished")
    assert "profiler was killed or stopped" in lines[1]


SLOW = """
import time, torch
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(100_000):
    opt.zero_grad(); model(torch.randn(8, 4)).sum().backward(); opt.step()
    time.sleep(0.05)
"""


def test_watch_stops_soon_after_the_profiler_and_its_training_are_killed(tmp_path, gpufeed_cli):
    runs = tmp_path / "runs"
    script = tmp_path / "slow.py"
    script.write_text(SLOW)
    argv = gpufeed_cli(
        "profile", "--out", str(runs), "-i", "0.1", "--", sys.executable, str(script)
    )
    prof = subprocess.Popen(argv, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 120
        while not any(runs.glob("*/steps-*.db")) and time.time() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)  # a few steps flushed
    finally:
        os.killpg(prof.pid, signal.SIGKILL)  # the profiler and the training: meta never finished
        prof.wait()
    run_dir = next(runs.glob("*/meta.json")).parent
    assert json.loads((run_dir / "meta.json").read_text())["end_time"] is None
    started = time.time()
    watch = subprocess.run(
        gpufeed_cli("report", str(run_dir), "--watch", "0.5"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert watch.returncode == 0, watch.stderr
    assert "have exited" in watch.stdout and "stopped watching" in watch.stdout, watch.stdout
    assert time.time() - started < 30  # seconds, not STALE_S


def test_a_report_that_cannot_be_written_names_the_file_and_how_to_write_elsewhere(make_run):
    # it said "cannot write RUN/.report.html.1234.tmp: Is a directory" (or a read-only mount's
    # error) and nothing about --out
    run_dir = make_run(ranks=STEPS)
    (run_dir / "report.html").mkdir()
    res = runner.invoke(app, ["report", str(run_dir)])
    assert res.exit_code == 2
    assert (
        f"cannot write {run_dir / 'report.html'}: Is a directory; give --out FILE in a folder "
        "you can write to"
    ) in res.stderr
    res = runner.invoke(app, ["report", str(run_dir), "-o", "/dev/full"])
    assert res.exit_code == 2 and "cannot write /dev/full: No space left on device" in res.stderr
    assert "give --out" not in res.stderr  # the user named this file
    res = runner.invoke(app, ["report", str(run_dir), "--json", ""])
    assert res.exit_code == 2 and "--json '': give a file name" in res.stderr
