"""The HTML report on hand-made run directories: multi-host runs, and what it shows of argv."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

import gpufeed
from gpufeed.analysis.finding import Finding
from gpufeed.analysis.result import Analysis, analyze_run
from gpufeed.analysis.run import Run
from gpufeed.present.html import render_html
from gpufeed.profiler.session import steps_store_path
from gpufeed.profiler.store import Store


def _analysis(run: Run, findings: list[Finding] | None = None) -> Analysis:
    """`run` analyzed as the commands do; `findings` given: those shown instead of the rules'."""
    result = analyze_run(run)
    return result if findings is None else dataclasses.replace(result, findings=findings)


def _figures(html: str) -> dict:
    return json.loads(re.search(r'id="chart-data">(.*?)</script>', html, re.S).group(1))


def test_report_of_a_multi_host_run_whose_rank_0_host_does_not_sort_first(make_run):
    # rank 0 on "node-b", rank 1 on "node-a": the host that sorts first has no rank 0.
    steps = {0: [(i, 1010.0 + i, 1011.0 + i, 0.25, 16.0, None) for i in range(5)]}
    run_dir = make_run(ranks=steps, host="node-b", system=[(1000.0, "cpu.util", "", 5.0)])
    store = Store(steps_store_path(run_dir, "node-a", 201))
    info = {"host": "node-a", "rank": 1, "local_rank": 0, "world_size": 2, "pid": 201}
    rows = [(i, 1010.0 + i, 1011.0 + i, 0.5, 16.0, None) for i in range(5)]
    store.write({**info, "start": 1000.0, "end": 1099.0}, steps=rows)
    store.close()
    run = gpufeed.load(run_dir)
    assert run.meta["hosts"] == ["node-a", "node-b"]
    html = render_html(run, _analysis(run, []))  # IndexError before
    breakdown = _figures(html)["chart-step-breakdown"]
    wait = breakdown["data"][0]["y"]
    assert wait == [250.0] * 5  # rank 0's data wait (rank 1 waits 500 ms)
    assert "rank 0 on node-b" in html


def test_report_redacts_secrets_left_in_an_old_meta_json(make_run):
    command = ["python", "t.py", "--pwd", "Pw9x", "--url", "https://u:p@ss@h/x", "-p", "Pw9x"]
    run = gpufeed.load(make_run(meta={"command": command}))
    html = render_html(run, _analysis(run, []))
    shown = re.search(r'<span id="run-command">(.*?)</span>', html, re.S).group(1)
    assert "Pw9x" not in shown and "ss@h" not in shown and "p@ss" not in shown
    assert "--pwd" in shown and "https://u:***@h/x" in shown


def test_a_name_and_command_that_are_not_utf8_are_shown_escaped(make_run):
    # `gpufeed profile --name $'n\xe9' -- python $'\xe9.py'` in a Latin-1 terminal: Python keeps the
    # bytes as lone surrogates, which meta.json stores as "\udce9".
    run = gpufeed.load(make_run(meta={"name": "n\udce9", "command": ["python", "\udce9.py"]}))
    html = render_html(run, _analysis(run, []))  # UnicodeEncodeError before
    html.encode("utf-8")
    assert '<span id="run-name">n\\xe9</span>' in html
    assert "\\xe9.py" in re.search(r'<span id="run-command">(.*?)</span>', html, re.S).group(1)


def test_findings_json_is_strict_json_with_null_where_nothing_was_measured(make_run):
    from gpufeed.analysis.finding import Finding
    from gpufeed.present.html import findings_json

    finding = Finding(
        "DataLoaderBottleneck",
        "warning",
        "input-bound",
        evidence={"data_wait_share": 0.8, "worker_cpu_pct": float("nan"), "x": float("inf")},
    )
    text = findings_json(gpufeed.load(make_run()), [finding])
    doc = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert doc["findings"][0]["evidence"] == {
        "data_wait_share": 0.8,
        "worker_cpu_pct": None,
        "x": None,
    }


def test_chart_data_is_strict_json(make_run):
    # a system store that lost its rows: chart series of nothing must not become NaN in the page
    run = gpufeed.load(
        make_run(ranks={0: [(i, 1010.0 + i, 1011.0 + i, None, 8.0, None) for i in range(5)]})
    )
    figures = re.search(
        r'id="chart-data">(.*?)</script>', render_html(run, _analysis(run, [])), re.S
    ).group(1)
    json.loads(figures, parse_constant=lambda c: pytest.fail(f"{c} in the chart data"))


def test_the_report_of_a_killed_run_says_it_did_not_finish_not_that_it_is_in_progress(
    make_run, tmp_path
):
    from gpufeed.commands.report import write_report

    steps = {0: [(i, 1010.0 + i, 1011.0 + i, 0.1, 8.0, None) for i in range(5)]}
    run_dir = make_run(meta={"end_time": None}, ranks=steps)  # nothing recorded since 1970
    page = write_report(run_dir, tmp_path / "r.html", echo=lambda _: None).read_text()
    header = re.search(r"<header>(.*?)</header>", page, re.S).group(1)
    assert "in progress" not in header
    assert "not finished" in header and "its profiler was killed or stopped" in header


def test_dropped_profiler_events_are_said_in_the_report_and_the_findings_json(make_run, tmp_path):
    from gpufeed.commands.report import write_report

    run_dir = make_run(meta={"dropped_events": 4242})
    out = tmp_path / "f.json"
    page = write_report(run_dir, tmp_path / "r.html", json_out=out, echo=lambda _: None)
    assert "4242 profiler events were dropped" in page.read_text()
    assert json.loads(out.read_text())["dropped_events"] == 4242
    write_report(make_run(), tmp_path / "r.html", json_out=out, echo=lambda _: None)
    assert json.loads(out.read_text())["dropped_events"] == 0


def test_json_and_traces_written_to_stdout_are_all_that_stdout_holds(
    make_run, gpufeed_cli, tmp_path
):
    import subprocess

    steps = {0: [(i, 1010.0 + i, 1011.0 + i, 0.5, 8.0, None) for i in range(20)]}  # input-bound
    run_dir = make_run(ranks=steps)
    for args in (
        ["report", str(run_dir), "--json", "/dev/stdout", "-o", str(tmp_path / "r.html")],
        ["trace", str(run_dir), "-o", "/dev/stdout"],
    ):
        cp = subprocess.run(gpufeed_cli(*args), capture_output=True, text=True, timeout=180)
        assert cp.returncode == 0, cp.stderr
        json.loads(cp.stdout)  # the status lines and findings went to stderr
        assert "written to" in cp.stderr
