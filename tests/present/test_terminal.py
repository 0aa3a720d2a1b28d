"""`gpufeed show` and `gpufeed ls`: what a user reads in the terminal."""

from __future__ import annotations

import dataclasses
import subprocess
import time

import pytest
from rich.console import Console

from gpufeed.analysis.finding import Finding
from gpufeed.analysis.result import Analysis, analyze_run
from gpufeed.analysis.run import Run
from gpufeed.commands.ls import list_runs
from gpufeed.commands.show import show


def _analysis(run: Run, findings: list[Finding] | None = None) -> Analysis:
    """`run` analyzed as the commands do; `findings` given: those shown instead of the rules'."""
    result = analyze_run(run)
    return result if findings is None else dataclasses.replace(result, findings=findings)


def _text(fn, *args) -> str:
    console = Console(record=True, width=160)
    fn(*args, console=console)
    return console.export_text()


STEPS = {0: [(i, 1010.0 + i, 1011.0 + i, 0.25, 16.0, None) for i in range(10)]}
CPU = [(1000.0 + i, "cpu.util", "", float(10 * i)) for i in range(11)]


def test_show_prints_phases_throughput_and_percentiles(make_run):
    out = _text(
        show, make_run(system=CPU, ranks=STEPS, meta={"gpu_unavailable": "NVML unavailable (x)"})
    )
    for part in ("Phases", "initialization", "training", "finalization", "Training steps"):
        assert part in out
    assert "1.00" in out and "16.0" in out  # steps/s and samples/s
    assert "25.0%" in out and "data wait: its share of step time" in out
    assert "cpu.util" in out and "100.0" in out  # max of 0..100
    assert "gpu." not in out and "NVML unavailable" in out


def test_show_says_what_the_training_thread_did_while_it_waited(make_run):
    from gpufeed.profiler.store import Store

    run_dir = make_run(system=CPU, ranks=STEPS)
    assert "Data wait:" not in _text(show, run_dir)  # not measured: nothing said
    (path,) = run_dir.glob("steps-*.db")
    store = Store(path)
    store.write(cpu_phases=[(i, 0.24, 0.0) for i in range(10)])  # 0.24 of each 0.25-s wait
    store.close()
    out = _text(show, run_dir)
    assert (
        "Data wait: the training thread was on a CPU 96% of it (it loads or unpacks the batches itself)"
        in out
    )


def test_show_sums_cpu_and_memory_per_process_role(make_run):
    procs = [(1000.0 + t, pid, role, cpu, 2**30) for t in range(3) for pid, role, cpu in PROCS]
    out = _text(show, make_run(system=CPU, ranks=STEPS, processes=procs))
    assert "Processes" in out
    lines = {line.split()[1]: line for line in out.splitlines() if line.startswith("│ ")}
    assert lines["main"].split("│")[2].strip() == "1" and "180%" in lines["main"]
    assert lines["worker"].split("│")[2].strip() == "2" and "100%" in lines["worker"]
    assert "2.00 GiB" in lines["worker"]


PROCS = [(100, "main", 180.0), (201, "worker", 60.0), (202, "worker", 40.0)]


def test_show_adds_up_processes_of_hosts_that_sample_at_different_moments(jittered_hosts):
    from gpufeed.present.terminal import print_run

    out = _text(
        lambda run, console: print_run(run, _analysis(run, []), console), jittered_hosts(hosts=8)
    )
    (main,) = [line for line in out.splitlines() if line.startswith("│ main")]
    # 8 hosts, each with one training process at 95% of a core and 2 GB (1.86 GiB)
    assert [c.strip() for c in main.split("│")[2:6]] == ["8", "760%", "760%", "14.90 GiB"]


def test_show_lists_gpu_rows_where_gpus_were_read(make_run):
    gpu = [(1000.0 + i, "gpu.util", "0", 90.0) for i in range(5)]
    out = _text(show, make_run(system=CPU + gpu, meta={"gpus": [{"index": 0, "name": "H100"}]}))
    assert "gpu.util" in out and "H100" in out


def test_show_a_run_with_zero_steps_says_so_and_what_may_be_why(make_run):
    out = " ".join(_text(show, make_run(system=CPU)).split())
    assert "No training steps were recorded: no process recorded any" in out
    assert "the profiler's hook was not loaded in it (a script that replaces PYTHONPATH" in out
    out = " ".join(_text(show, make_run(system=CPU, ranks={0: []})).split())
    assert "its training processes did no optimizer step" in out
    out = " ".join(_text(show, make_run(system=CPU, meta={"exit_code": 137})).split())
    assert (
        "No training steps were recorded: it was killed before its first steps were written" in out
    )


def test_show_an_unfinished_run_says_so(make_run):
    out = _text(show, make_run(ranks=STEPS, meta={"end_time": None}))
    assert "did not finish cleanly" in out


def test_show_cli_on_a_bad_path_is_a_clear_error(tmp_path, gpufeed_cli):
    cp = subprocess.run(gpufeed_cli("show", str(tmp_path)), capture_output=True, text=True)
    assert cp.returncode == 2
    assert "not a gpufeed run directory" in cp.stderr and "Traceback" not in cp.stderr


def test_ls_lists_runs_newest_first(make_run, tmp_path):
    first, second = make_run(), make_run(meta={"end_time": None})
    runs = list_runs(tmp_path, console=Console(record=True, width=200))
    assert set(runs) == {first, second}
    out = _text(list_runs, tmp_path)
    assert first.name in out and "unfinished" in out


def test_ls_in_80_columns_keeps_every_column_and_cuts_only_the_command(make_run, tmp_path):
    argv = ["python", "-m", "trainer.main", "--config", "configs/resnet50.yaml", "--epochs", "90"]
    run = make_run(meta={"command": argv, "exit_code": 3})
    narrow = Console(record=True, width=80)
    list_runs(tmp_path, console=narrow)
    out = narrow.export_text()
    assert max(map(len, out.splitlines())) <= 80
    started = time.strftime("%Y-%m-%d %H:%M", time.localtime(1000.0))  # to the minute
    assert run.name in out and started in out and "100.00 s" in out and "│    3 │" in out
    assert "python -m" in out and "…" in out
    # a wide terminal shows the whole command, past the 60 characters it was once cut to
    assert len(" ".join(argv)) > 60 and " ".join(argv) in _text(list_runs, tmp_path)


def test_ls_never_cuts_a_run_name_it_drops_the_command_where_there_is_no_room(make_run, tmp_path):
    # a default name from a script name of 11+ characters was cut ("train_small-2026…-1143…"),
    # so it could not be copied into `gpufeed show`
    run = make_run(meta={"command": ["python", "train_small.py"], "exit_code": 0})
    long = run.rename(tmp_path / "train_small_resnet50-20261124-234606-11431")
    shown = {}
    for width in (200, 80, 60):
        console = Console(record=True, width=width)
        list_runs(tmp_path, console=console)
        shown[width] = console.export_text()
        assert f"│ {long.name} │" in shown[width], width
    assert "python train_small.py" in shown[200]
    assert "command" not in shown[60] and "python" not in shown[60]  # no room left for it


def test_ls_of_an_empty_folder_says_how_to_make_a_run(tmp_path):
    assert "gpufeed profile" in _text(list_runs, tmp_path)


def test_show_prints_the_findings(make_run):
    # Every step waits 90% of its time for data: DataLoaderBottleneck fires.
    slow = {0: [(i, 1010.0 + i, 1011.0 + i, 0.9, 16.0, None) for i in range(40)]}
    out = _text(show, make_run(system=CPU, ranks=slow))
    assert "Findings" in out and "no bottleneck found" not in out
    assert "CRITICAL" in out or "WARNING" in out
    assert "evidence: data_wait_share=" in out


def test_ls_of_a_run_directory_lists_that_run(make_run):
    # it used to say "No runs under RUN/"
    run = make_run(ranks=STEPS)
    assert list_runs(run, console=Console(record=True, width=200)) == [run]
    assert run.name in _text(list_runs, run)


def test_ls_sorts_by_start_time_not_by_folder_time(make_run, tmp_path):
    import os

    late = make_run(meta={"start_time": 2000.0, "end_time": 2100.0})
    early = make_run(meta={"start_time": 1000.0, "end_time": 1100.0})
    os.utime(late / "meta.json", (1, 1))  # written long ago, e.g. copied with an old mtime
    runs = list_runs(tmp_path, console=Console(record=True, width=200))
    assert runs == [late, early]


def test_the_training_steps_fit_an_80_column_terminal(make_run):
    console = Console(record=True, width=80)
    show(make_run(system=CPU, ranks=STEPS), console=console)
    out = console.export_text()
    table = out[out.index("Training steps") : out.index("data wait: its share")]
    assert "…" not in table and max(map(len, table.splitlines())) <= 80
    assert "│    10 │     1 │    1.00 │      16.0 │" in table and "25.0% │" in table


def test_a_long_command_wraps_under_itself_in_80_columns(make_run):
    argv = [
        "torchrun",
        "--nproc_per_node",
        "8",
        "train.py",
        *(f"--option-{i} value-{i}" for i in range(8)),
    ]
    console = Console(record=True, width=80)
    show(make_run(ranks=STEPS, meta={"command": argv}), console=console)
    lines = console.export_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("  command   torchrun"))
    hosts = next(i for i, line in enumerate(lines) if line.startswith("  hosts     "))
    assert hosts > at + 1 and max(map(len, lines[: hosts + 1])) <= 80
    assert all(line.startswith(" " * 12) for line in lines[at + 1 : hosts])  # under the value
    assert "--option-7 value-7" in "".join(lines[at:hosts])


def test_show_gives_the_data_wait_over_every_step_and_after_the_warm_up_the_findings_skip(
    make_run, tmp_path
):
    # 5 warm-up steps wait 0.9 of their 1 s, the 15 after them 0.1: 30% over all, 10% after
    steps = {0: [(i, 1010.0 + i, 1011.0 + i, 0.9 if i < 5 else 0.1, 16.0, None) for i in range(20)]}
    run = make_run(system=CPU, ranks=steps)
    out = " ".join(_text(show, run).split())
    assert "│ 30.0% │" in out
    assert "warm-up included; 10.0% after the 5 warm-up steps the findings leave out" in out
    config = tmp_path / "warm.toml"
    config.write_text("[rules.warmup]\nsteps = 0\nseconds = 0\n")  # none: one share for both
    console = Console(record=True, width=160)
    show(run, console=console, config=config)
    out = " ".join(console.export_text().split())
    assert "includes its wait) over every step" in out and "warm-up included" not in out


def test_with_several_ranks_show_counts_the_warm_up_steps_of_each_rank(make_run):
    steps = [(i, 1010.0 + i, 1011.0 + i, 0.9 if i < 5 else 0.1, 16.0, None) for i in range(20)]
    out = " ".join(_text(show, make_run(system=CPU, ranks={0: steps, 1: steps})).split())
    assert "10.0% after the 5 warm-up steps of each rank the findings leave out" in out


@pytest.mark.parametrize(("code", "killed"), [(137, True), (143, True), (-9, True), (255, False)])
def test_only_a_signal_exit_code_reads_as_killed(make_run, code: int, killed: bool):
    # sys.exit(-1) and `exit 255` give 255: a failure, not a signal (128 + N, N < NSIG)
    out = " ".join(_text(show, make_run(system=CPU, meta={"exit_code": code})).split())
    assert ("it was killed before its first steps were written" in out) is killed
