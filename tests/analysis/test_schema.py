"""The schema table (`gpufeed.analysis.schema`) is what `load` returns, what run.py's column lists
are, what the docs render (`frames_markdown`) and what `help(gpufeed.load)` shows."""

from __future__ import annotations

import pydoc
import re
import subprocess
import sys

import gpufeed
from gpufeed.analysis import schema
from gpufeed.analysis.run import EVAL_COLUMNS, PROCESS_COLUMNS, STEP_COLUMNS, SYSTEM_COLUMNS


def _names(frame: schema.Frame) -> list[str]:
    return [f.name for f in frame.fields]


def test_loaded_frames_have_exactly_the_tables_columns(make_run):
    run = gpufeed.load(
        make_run(
            system=[(1001.0, "cpu.util", "", 40.0)],
            ranks={0: [(0, 1010.0, 1011.0, 0.25, 32.0, None)]},
            processes=[(1001.0, 100, "main", 95.0, 1e9)],
            evals={0: [(1020.0, 1021.0, 2, 8.0, 0.1)]},
        )
    )
    for frame in (schema.STEPS, schema.HEADSPACE, schema.SYSTEM, schema.PROCESSES, schema.EVALS):
        assert list(getattr(run, frame.name).columns) == _names(frame), frame.name
    assert isinstance(run.workers, dict) and not schema.WORKERS.fields


def test_run_pys_column_lists_are_the_tables_without_what_load_adds():
    assert _names(schema.STEPS)[:-1] == STEP_COLUMNS and _names(schema.STEPS)[-1] == "t"
    assert SYSTEM_COLUMNS == ["time", "host", "metric", "device", "value"]
    assert PROCESS_COLUMNS == ["time", "host", "pid", "role", "cpu", "rss"]
    assert _names(schema.EVALS)[:-1] == EVAL_COLUMNS
    added = {f.name for frame in schema.FRAMES for f in frame.fields if f.added}
    assert added == {schema.RELATIVE_TIME}


def test_every_meta_key_a_run_can_hold_is_in_the_table(make_run):
    from gpufeed.profiler.launch import _initial_meta

    written = {**_initial_meta(["python", "t.py"], "t", 0.2), "headspace": 30, "error": "x"}
    run = gpufeed.load(make_run(meta=written, ranks={0: [(0, 1.0, 2.0, 0.0, 8.0, None)]}))
    documented = {f.name for f in schema.META.fields}
    assert set(run.meta) <= documented
    assert {f"ranks[i].{k}" for k in run.meta["ranks"][0]} - documented == {
        f"ranks[i].{k}" for k in ("host", "rank", "local_rank", "world_size", "pid", "start", "end")
    }  # those named in the row of `ranks`


def test_the_metric_table_is_the_order_show_and_report_use():
    from gpufeed.analysis.stats import METRIC_ORDER

    assert tuple(_names(schema.METRICS)) == METRIC_ORDER


def test_one_display_unit_per_quantity():
    assert schema.unit("mem.used").shown == schema.unit("gpu.mem_total").shown == "GiB"
    assert schema.unit("mem.used").divisor == 2**30
    assert schema.unit("net.rx").shown == schema.unit("gpu.pcie_tx").shown == "MB/s"
    assert schema.unit("cpu.core").tag == "percent" and schema.unit("no.such").tag == ""
    assert {f.unit for f in schema.METRICS.fields} <= set(schema.UNITS)


def test_markdown_holds_a_well_formed_table_per_frame():
    text = schema.frames_markdown()
    for title in ("`run.steps`", "`run.system`", "`run.meta`", "`run.headspace`", "`run.workers`"):
        assert f"## {title}\n" in text
    rows = [line for line in text.splitlines() if line.startswith("|")]
    assert all(len(re.split(r"(?<!\\)\|", row)) == 5 for row in rows)  # 3 cells each
    for frame in schema.FRAMES:
        if frame is not schema.HEADSPACE:
            assert all(f"| `{f.name}` |" in text for f in frame.fields)
    assert "bytes as GiB" in text and "bytes/s as MB/s" in text


def test_help_of_load_shows_the_table():
    text = pydoc.render_doc(gpufeed.load, renderer=pydoc.plaintext)
    assert text.startswith("Python Library Documentation") and "Load a run directory" in text
    for name in ("data_wait_ready", "gpu.mem_used", "run.meta", "run.headspace", "host_cpu_counts"):
        assert name in text
    assert re.search(r"\n +t +s +seconds since the run started", text)


def test_import_gpufeed_stays_cheap_with_the_table_in_loads_docstring():
    code = "import sys, gpufeed; print(sorted({'pandas', 'numpy'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
