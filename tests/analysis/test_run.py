"""`gpufeed.load`: run directories as pandas frames, following the schema in gpufeed.analysis.run."""

from __future__ import annotations

import math

import pytest

import gpufeed
from gpufeed.analysis.run import (
    EVAL_COLUMNS,
    PROCESS_COLUMNS,
    STEP_COLUMNS,
    SYSTEM_COLUMNS,
    RunError,
)
from gpufeed.profiler.session import hostname, steps_store_path
from gpufeed.profiler.store import Store


def test_frames_follow_the_schema_and_merge_ranks(make_run):
    run_dir = make_run(
        system=[(1001.0, "cpu.util", "", 40.0), (1000.5, "cpu.core", "0", 80.0)],
        ranks={
            0: [(0, 1010.0, 1011.0, 0.25, 32.0, None), (1, 1011.0, 1011.5, 0.0, 32.0, None)],
            1: [(0, 1010.0, 1011.2, 0.5, 32.0, None)],
        },
        processes=[(1001.0, 100, "other", 95.0, 1e9), (1001.0, 555, "worker", 20.0, 5e8)],
    )
    run = gpufeed.load(run_dir)
    assert list(run.system.columns) == [*SYSTEM_COLUMNS, "t"]  # t: added by load
    assert list(run.steps.columns) == [*STEP_COLUMNS, "t"]
    assert list(run.processes.columns) == [*PROCESS_COLUMNS, "t"]
    assert list(run.system["time"]) == [1000.5, 1001.0]  # time-ordered
    steps = run.steps
    assert list(zip(steps["rank"], steps["step"], strict=True)) == [(0, 0), (0, 1), (1, 0)]
    assert list(steps["duration"]) == pytest.approx([1.0, 0.5, 1.2])
    assert steps["gpu_time"].isna().all()
    # pid 100 registered as rank 0's training process, so it is "main" whatever the sampler thought.
    assert dict(zip(run.processes["pid"], run.processes["role"], strict=True)) == {
        100: "main",
        555: "worker",
    }
    meta = run.meta
    assert meta["finished"] and meta["hosts"] == ["h1"] and meta["dropped_events"] == 0
    assert [(r["rank"], r["pid"], r["world_size"]) for r in meta["ranks"]] == [
        (0, 100, 2),
        (1, 101, 2),
    ]


def test_a_run_without_steps_has_empty_frames_with_columns(make_run):
    run = gpufeed.load(make_run())
    assert len(run.steps) == 0 and list(run.steps.columns) == [*STEP_COLUMNS, "t"]
    assert len(run.system) == 0 and list(run.system.columns) == [*SYSTEM_COLUMNS, "t"]
    assert list(run.headspace.columns) == [*STEP_COLUMNS, "t"]
    assert list(run.evals.columns) == [*EVAL_COLUMNS, "t"]


def test_every_frame_with_times_counts_seconds_since_the_run_started_in_t(make_run):
    run = gpufeed.load(
        make_run(
            meta={"start_time": 1000.0},
            system=[(1001.5, "cpu.util", "", 40.0)],
            ranks={0: [(0, 1010.0, 1011.0, 0.25, 32.0, None)]},
            processes=[(1002.0, 100, "main", 95.0, 1e9)],
            evals={0: [(1020.0, 1022.5, 4, 128.0, 0.1)]},
        )
    )
    assert list(run.system["t"]) == [1.5]
    assert list(run.processes["t"]) == [2.0]
    assert list(run.steps["t"]) == [11.0]  # at the step's end: its start may be unknown
    assert list(run.evals["t"]) == [22.5]
    assert list(run.steps["t"] - run.steps["duration"]) == [10.0]


def test_without_a_start_time_t_counts_from_the_first_record(make_run):
    run = gpufeed.load(
        make_run(
            meta={"start_time": None},
            system=[(1003.0, "cpu.util", "", 40.0)],
            ranks={0: [(0, 1001.0, 1002.0, 0.25, 32.0, None)]},
        )
    )
    assert list(run.steps["t"]) == [1.0] and list(run.system["t"]) == [2.0]


def test_a_run_still_being_written_loads_and_says_so(make_run):
    run_dir = make_run(meta={"end_time": None, "exit_code": None})
    writer = Store(steps_store_path(run_dir, hostname(), 4242))
    writer.write(
        {"host": hostname(), "rank": 0, "pid": 4242}, steps=[(0, 1.0, 2.0, 0.1, 8.0, None)]
    )
    try:
        run = gpufeed.load(run_dir)  # the writer is still open
        assert len(run.steps) == 1 and run.steps["pid"].iloc[0] == 4242
        assert not run.meta["finished"] and "did not finish" in run.meta["not_finished"]
    finally:
        writer.close()


def test_a_store_written_before_wait_cpu_was_measured_loads_it_as_unknown(make_run):
    import sqlite3

    run_dir = make_run(ranks={0: [(0, 1.0, 2.0, 0.5, 8.0, None), (1, 2.0, 3.0, 0.4, 8.0, None)]})
    (path,) = run_dir.glob("steps-*.db")
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE cpu_phases")  # as in gpufeed before the table existed
    assert gpufeed.load(run_dir).steps["data_wait_cpu"].isna().all()

    store = Store(path)  # a store that has the table: each step's CPU, NaN where not written
    store.write(cpu_phases=[(1, 0.38, 0.02)])
    store.close()
    steps = gpufeed.load(run_dir).steps
    assert steps["data_wait_cpu"].tolist() == pytest.approx([math.nan, 0.38], nan_ok=True)
    assert steps["data_wait_ready"].tolist() == pytest.approx([math.nan, 0.02], nan_ok=True)


def test_a_column_an_older_writer_did_not_have_loads_as_unknown(make_run):
    import sqlite3

    run_dir = make_run(ranks={0: [(0, 1.0, 2.0, 0.5, 8.0, None)]})
    (path,) = run_dir.glob("steps-*.db")
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE cpu_phases")
        db.execute("CREATE TABLE cpu_phases (step INTEGER PRIMARY KEY, data_wait REAL)")
        db.execute("INSERT INTO cpu_phases VALUES (0, 0.4)")
    steps = gpufeed.load(run_dir).steps
    assert steps["data_wait_cpu"].tolist() == [0.4] and steps["data_wait_ready"].isna().all()


def test_unknown_start_gives_nan_duration(make_run):
    run = gpufeed.load(make_run(ranks={0: [(0, None, 5.0, 0.0, None, None)]}))
    assert math.isnan(run.steps["duration"].iloc[0]) and math.isnan(run.steps["samples"].iloc[0])


def test_not_a_run_directory_is_a_clear_error(tmp_path):
    with pytest.raises(RunError, match="not a directory"):
        gpufeed.load(tmp_path / "missing")
    with pytest.raises(RunError, match="not a gpufeed run directory"):
        gpufeed.load(tmp_path)


def test_damaged_meta_is_a_clear_error(make_run):
    run_dir = make_run()
    (run_dir / "meta.json").write_text("{not json")
    with pytest.raises(RunError, match=r"meta\.json is not valid JSON"):
        gpufeed.load(run_dir)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[1, 2]", r"meta\.json holds a JSON list, not an object"),
        ('{"hosts": 5}', r"meta\.json: 'hosts' is 5, expected list"),
        ('{"hosts": [5]}', r"'hosts' must be a list of host names"),
        ('{"end_time": "soon"}', r"'end_time' is 'soon', expected int or float or null"),
        ('{"gpus": [1]}', r"'gpus' must be a list of objects"),  # was an AttributeError
        ('{"start_time": 1e300}', r"'start_time' is 1e\+300, not a time"),  # an OverflowError
    ],
)
def test_meta_of_the_wrong_shape_is_a_clear_error(make_run, content, message):
    run_dir = make_run()
    (run_dir / "meta.json").write_text(content)
    with pytest.raises(RunError, match=message):
        gpufeed.load(run_dir)


def test_text_in_a_number_column_is_a_clear_error(make_run):
    run_dir = make_run(ranks={0: [(0, "yesterday", 1011.0, 0.25, 32.0, None)]})
    with pytest.raises(RunError, match=r"holds a value that is not a number .*profile it again"):
        gpufeed.load(run_dir)


def test_a_damaged_store_is_left_out_and_named_and_the_rest_is_read(make_run):
    # one store cut short (an interrupted copy) made the whole run unreadable, in every command
    steps = [(i, 1010.0 + i, 1011.0 + i, 0.2, 32.0, None) for i in range(20)]
    run_dir = make_run(ranks={0: steps, 1: steps})
    damaged, _ = sorted(run_dir.glob("steps-*.db"))
    damaged.write_bytes(b"SQLite format 3\x00" + b"\x13" * 4000)
    with pytest.warns(RuntimeWarning, match=rf"left out 1 store file.*{damaged.name} \("):
        run = gpufeed.load(run_dir)
    assert len(run.steps) == 20 and run.steps["rank"].nunique() == 1
    (note,) = run.meta["damaged_stores"]
    assert note.startswith(f"{damaged.name} (")

    from typer.testing import CliRunner

    from gpufeed.cli import app

    with pytest.warns(RuntimeWarning, match="left out 1 store file"):
        res = CliRunner().invoke(app, ["show", str(run_dir)])
    assert res.exit_code == 0, res.output
    assert f"1 store file could not be read and is left out: {damaged.name}" in res.stdout
    for store in run_dir.glob("*.db"):
        store.write_bytes(b"not a database" * 100)
    (run_dir / "meta.json").unlink()
    with pytest.raises(RunError, match="no file of the run could be read"):
        gpufeed.load(run_dir)


@pytest.mark.parametrize(
    ("table", "change", "why"),
    [
        ("info", "UPDATE info SET value='null' WHERE key='rank'", "its info 'rank' is None"),
        ("info", "UPDATE info SET value='\"x\"' WHERE key='pid'", "its info 'pid' is 'x'"),
        ("processes", "UPDATE processes SET pid=NULL", "a process sample without a process id"),
    ],
)
def test_a_store_holding_what_no_writer_writes_is_left_out_naming_the_key(
    make_run, table, change, why
):
    # a null rank or pid (a damaged or hand-edited file) was a TypeError deep in the rules
    import sqlite3

    run_dir = make_run(
        ranks={0: [(i, 1010.0 + i, 1011.0 + i, 0.2, 32.0, None) for i in range(5)]},
        processes=[(1010.0, 100, "main", 50.0, 1e8)],
    )
    (store,) = run_dir.glob("steps-*.db" if table == "info" else "system-*.db")
    with sqlite3.connect(store) as db:
        db.execute(change)
    with pytest.warns(RuntimeWarning, match=rf"{store.name} \({why}"):
        run = gpufeed.load(run_dir)
    assert run.meta["damaged_stores"][0].startswith(f"{store.name} ({why}")
    gpufeed.analyze(run)  # the rest is analyzed
