"""Several hosts' run directories load as one run: `gpufeed.load([...])`, a glob, and the CLI."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

import gpufeed
from gpufeed.analysis.run import RunError

HEALTHY = Path(__file__).resolve().parents[1] / "scenarios" / "healthy.py"


_PARTS: list[Path] = []


@pytest.fixture
def two_hosts(run_profiled, tmp_path: Path) -> list[Path]:
    """A two-node job as the real profiler leaves it: one run directory per host (rank 0, rank 1)."""
    if not _PARTS:
        for rank, host in enumerate(("node-a", "node-b")):
            env = {"GPUFEED_HOST": host, "RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": "2"}
            cp, run_dir = run_profiled(HEALTHY, out=tmp_path / host, extra_env=env)
            assert cp.returncode == 0 and run_dir is not None, cp.stderr[-2000:]
            _PARTS.append(run_dir)
    return _PARTS


def test_two_hosts_load_as_one_run(two_hosts):
    a, b = two_hosts
    one, other = gpufeed.load(a), gpufeed.load(b)
    run = gpufeed.load([b, a])
    assert run.meta["hosts"] == ["node-a", "node-b"]
    assert [(r["host"], r["rank"]) for r in run.meta["ranks"]] == [("node-a", 0), ("node-b", 1)]
    assert len(run.steps) == len(one.steps) + len(other.steps) > 0
    assert sorted(run.steps.groupby(["host", "rank"]).groups) == [("node-a", 0), ("node-b", 1)]
    assert set(run.system["host"]) == {"node-a", "node-b"}
    assert set(run.processes["host"]) == {"node-a", "node-b"}
    assert run.meta["start_time"] == min(one.meta["start_time"], other.meta["start_time"])
    assert run.meta["end_time"] == max(one.meta["end_time"], other.meta["end_time"])
    assert run.meta["finished"] and run.meta["parts"] == [str(a), str(b)]
    assert list(run.system["time"]) == sorted(run.system["time"])


def test_a_glob_names_the_parts(two_hosts):
    a, _ = two_hosts
    run = gpufeed.load(str(a.parents[1] / "node-*" / "*"))
    assert run.meta["hosts"] == ["node-a", "node-b"]


def test_the_same_run_twice_is_refused(two_hosts, tmp_path):
    a, _ = two_hosts
    copy = tmp_path / "copy"
    shutil.copytree(a, copy)
    with pytest.raises(RunError, match="both hold rank 0 of host 'node-a'"):
        gpufeed.load([a, copy])


def test_one_run_directory_given_in_two_spellings_is_read_once(make_run, monkeypatch):
    run_dir = make_run(ranks={0: [(0, 1010.0, 1011.0, 0.1, 8.0, None)]})
    monkeypatch.chdir(run_dir.parent)
    run = gpufeed.load([run_dir, run_dir.name, f"./{run_dir.name}/"])
    assert len(run.steps) == 1 and "parts" not in run.meta


def test_hosts_sampled_at_different_intervals_are_binned_at_the_longest(make_run):
    a = make_run(meta={"interval": 0.2, "hosts": ["h1"]}, host="h1")
    b = make_run(meta={"interval": 1.0, "hosts": ["h2"]}, host="h2")
    assert gpufeed.load([a, b]).meta["interval"] == 1.0


def test_two_runs_of_one_host_at_different_times_are_refused(make_run):
    steps = {0: [(i, 1010.0 + i, 1011.0 + i, 0.1, 16.0, None) for i in range(5)]}
    trained = make_run(meta={"start_time": 1000.0, "end_time": 1100.0}, ranks=steps)
    later = make_run(meta={"start_time": 5000.0, "end_time": 5100.0})  # no steps, so no ranks
    with pytest.raises(RunError, match="both come from host 'h1' but ran at different times"):
        gpufeed.load([trained, later])
    # the same host's parts at the same time (e.g. ranks that each profiled themselves) are one run
    beside = make_run(meta={"start_time": 1050.0, "end_time": 1150.0})
    assert gpufeed.load([trained, beside]).meta["parts"] == [str(trained), str(beside)]


def test_the_evaluation_passes_of_every_part_are_kept(make_run):
    steps = [(i, 1010.0 + i, 1011.0 + i, 0.1, 16.0, None) for i in range(10)]
    parts = [
        make_run(host=host, ranks={rank: steps}, evals={rank: [(1020.0, 1022.0, 4, 64, 0.5)]})
        for rank, host in enumerate(("node-a", "node-b"))
    ]
    run = gpufeed.load(parts)
    assert sorted(zip(run.evals["host"], run.evals["rank"], strict=True)) == [
        ("node-a", 0),
        ("node-b", 1),
    ]
    assert list(run.evals["duration"]) == [2.0, 2.0]


def test_relative_time_counts_from_the_earliest_parts_start_in_every_frame(make_run):
    parts = [
        make_run(
            host=host,
            meta={"start_time": start, "hosts": [host]},
            system=[(1010.0, "cpu.util", "", 50.0)],
            processes=[(1010.0, 100 + rank, "main", 90.0, 1e9)],
            ranks={rank: [(0, 1010.0, 1012.0, 0.1, 16.0, None)]},
            evals={rank: [(1020.0, 1022.0, 4, 64, 0.5)]},
        )
        for rank, (host, start) in enumerate((("node-a", 1004.0), ("node-b", 1000.0)))
    ]
    run = gpufeed.load(parts)
    assert run.meta["start_time"] == 1000.0
    assert list(run.system["t"]) == list(run.processes["t"]) == [10.0, 10.0]
    assert list(run.steps["t"]) == [12.0, 12.0]
    assert list(run.evals["t"]) == [22.0, 22.0]


def test_a_glob_that_matches_nothing_is_a_clear_error(tmp_path):
    with pytest.raises(RunError, match="matches no directory"):
        gpufeed.load(str(tmp_path / "nothing-*"))


def test_cli_commands_take_several_runs(two_hosts, tmp_path, gpufeed_cli):
    html, trace, tb = tmp_path / "r.html", tmp_path / "t.json", tmp_path / "tb"
    out = {}
    for command, *options in (
        ("show",),
        ("report", "-o", str(html)),
        ("trace", "-o", str(trace)),
        ("export", "--tensorboard", str(tb)),
    ):
        argv = gpufeed_cli(command, *map(str, two_hosts), *options)
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert cp.returncode == 0, f"{command}: {cp.stderr}"
        out[command] = cp.stdout
    assert "node-a, node-b" in out["show"] and "Findings" in out["show"]
    assert "node-b:rank 1" in html.read_text()
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {"node-a", "node-b"}
    # one folder for the combined run, named after its first run directory
    assert {p.relative_to(tb).as_posix() for p in tb.glob("*/*/*")} == {
        f"{two_hosts[0].name}/{folder}"
        for folder in ("node-a/rank0", "node-a/system", "node-b/rank1", "node-b/system")
    }
