"""Statistics shared by the summary and the rules: percentiles, phases, step throughput."""

from __future__ import annotations

import math

import numpy as np
import pytest

import gpufeed
from gpufeed.analysis.stats import percentile_table, phases, step_summary, wait_cpu_note


def test_percentile_table_matches_numpy_per_metric_and_device(make_run):
    rng = np.random.default_rng(0)
    util = rng.uniform(0, 100, 50)
    core1 = rng.uniform(0, 100, 50)
    system = [(1000.0 + i, "cpu.util", "", float(v)) for i, v in enumerate(util)]
    system += [(1000.0 + i, "cpu.core", "1", float(v)) for i, v in enumerate(core1)]
    system += [(1000.0, "mem.used", "", 5.0), (1000.0, "cpu.core", "0", 1.0)]
    table = percentile_table(gpufeed.load(make_run(system=system)))
    assert list(table.index) == [
        ("cpu.util", ""),
        ("cpu.core", "0"),
        ("cpu.core", "1"),
        ("mem.used", ""),
    ]
    assert list(table.columns) == ["n", "min", "p50", "p90", "p95", "p99", "max"]
    row = table.loc[("cpu.util", "")]
    assert row["n"] == 50
    assert row["min"] == util.min() and row["max"] == util.max()
    assert row["p95"] == pytest.approx(np.percentile(util, 95))
    assert table.loc[("cpu.core", "1"), "p50"] == pytest.approx(np.median(core1))


def test_percentile_table_of_a_run_without_samples_is_empty(make_run):
    assert len(percentile_table(gpufeed.load(make_run()))) == 0


def test_phases_split_the_run_at_the_first_and_last_step(make_run):
    run = gpufeed.load(
        make_run(
            meta={"start_time": 1000.0, "end_time": 1030.0},
            ranks={
                0: [(0, 1005.0, 1006.0, 0.0, 1.0, None), (1, 1006.0, 1020.0, 0.0, 1.0, None)],
                1: [(0, 1004.0, 1006.0, 0.0, 1.0, None), (1, 1006.0, 1025.0, 0.0, 1.0, None)],
            },
        )
    )
    ph = phases(run)
    assert list(ph["phase"]) == ["initialization", "training", "finalization"]
    assert list(ph["duration"]) == [4.0, 21.0, 5.0]


def test_without_steps_the_whole_run_is_initialization(make_run):
    ph = phases(gpufeed.load(make_run(meta={"start_time": 1000.0, "end_time": 1012.0})))
    assert list(ph["phase"]) == ["initialization"] and list(ph["duration"]) == [12.0]


def test_step_summary(make_run):
    # Rank 0: 4 steps of 0.5 s, 0.1 s waiting each; 8 samples per step.
    rows = [(i, 1000.0 + 0.5 * i, 1000.5 + 0.5 * i, 0.1, 8.0, None) for i in range(4)]
    s = step_summary(gpufeed.load(make_run(ranks={0: rows})))
    assert s["steps"] == 4 and s["ranks"] == 1
    assert s["steps_per_s"] == pytest.approx(2.0)
    assert s["samples_per_s"] == pytest.approx(16.0)
    assert s["step_p50"] == pytest.approx(0.5) and s["step_p95"] == pytest.approx(0.5)
    assert s["data_wait_share"] == pytest.approx(0.2)


@pytest.mark.parametrize(
    ("wait", "cpu", "said"),
    [
        (
            0.4,
            0.99,
            "the training thread was on a CPU 99% of it (it loads or unpacks the batches itself)",
        ),
        (
            0.4,
            0.03,
            "the training thread was on a CPU 3% of it (asleep on loader workers or storage)",
        ),
        (0.4, 0.5, "on a CPU 50% of it (partly working on the batches, partly asleep)"),
        # on a busy host: half on a CPU, the rest runnable but kept off a core, not asleep
        (0.4, (0.5, 0.45), "on a CPU 50% of it and waiting for a free core 45% (it loads or"),
        (0.02, 0.99, None),  # a short wait is mostly handing over ready batches: not worth a word
        (0.4, math.nan, None),  # not measured
    ],
)
def test_what_the_training_thread_did_while_it_waited(wait, cpu, said):
    cpu, ready = cpu if isinstance(cpu, tuple) else (cpu, math.nan)
    note = wait_cpu_note(
        {"data_wait_share": wait, "data_wait_cpu_share": cpu, "data_wait_ready_share": ready}
    )
    if said is None:
        assert note is None
    else:
        assert note is not None and said in note


def test_step_summary_without_steps_is_nan(make_run):
    s = step_summary(gpufeed.load(make_run()))
    assert s["steps"] == 0 and math.isnan(s["steps_per_s"]) and math.isnan(s["data_wait_share"])
    assert math.isnan(s["data_wait_cpu_share"]) and math.isnan(s["data_wait_ready_share"])


def test_step_phases_take_the_gpu_clock_where_cuda_events_timed_the_model():
    import pandas as pd

    from gpufeed.analysis.stats import step_phases

    steps = pd.DataFrame(
        {
            "duration": [0.010, 0.010, 0.010],
            "data_wait": [0.002, 0.006, np.nan],
            "forward": [0.001, 0.001, 0.001],  # host: launch time only
            "backward": [0.001, 0.001, 0.001],
            "optimizer": [0.001, 0.001, 0.001],
            "other": [0.005, 0.001, 0.007],
        }
    )
    host, clock = step_phases(steps)
    assert clock == "host" and host["other"].tolist() == [0.005, 0.001, 0.007]
    gpu = steps.assign(gpu_forward=0.002, gpu_backward=0.004, gpu_optimizer=0.001)
    parts, clock = step_phases(gpu)
    assert clock == "cuda"
    assert parts["backward"].tolist() == [0.004] * 3
    # what the wall time leaves; never negative where GPU work overlapped the next batch's wait
    assert parts["other"].tolist() == pytest.approx([0.001, 0.0, 0.003])
    unmeasured = gpu.assign(gpu_forward=np.nan, gpu_backward=np.nan, gpu_optimizer=np.nan)
    assert step_phases(unmeasured)[1] == "host"


def test_time_bins_leave_no_bin_empty_when_samples_jitter_and_hosts_sample_apart(jittered_hosts):
    from gpufeed.analysis.stats import bin_index, run_span, time_bins

    for hosts in (1, 2, 8):
        run = jittered_hosts(hosts=hosts)
        edges = time_bins(run, *run_span(run), most=1200)
        for _, g in run.system.groupby("host"):
            filled = np.unique(bin_index(g["time"], edges))
            # every bin after the host's first sample holds one of its samples
            assert filled.tolist() == list(range(filled[0], len(edges) - 1)), hosts
        assert len(edges) - 1 <= 10.0 / (1.5 * 0.2)  # not one bin per sample time of all hosts


def test_role_totals_add_up_hosts_that_sample_at_different_moments(jittered_hosts):
    from gpufeed.analysis.stats import role_totals, run_span, time_bins

    run = jittered_hosts(hosts=8)
    edges = time_bins(run, *run_span(run), most=1200)
    cpu = role_totals(run, edges, "cpu")["main"].dropna()
    rss = role_totals(run, edges, "rss", how="max")["main"]
    # 8 training processes at 95% of a core and 2 GB each: 760% and 16 GB once every host sampled
    assert cpu.quantile(0.5) == pytest.approx(8 * 95.0)
    assert rss.max() == pytest.approx(8 * 2e9)


def test_role_totals_of_a_role_that_lives_part_of_the_run_are_unknown_not_0_elsewhere(make_run):
    from gpufeed.analysis.stats import role_totals, run_span, time_bins

    # a loader worker at 50% of a core during the second half of the run only
    procs = [(1000.0 + 0.2 * i, 100, "main", 100.0, 1e9) for i in range(100)]
    procs += [(1000.0 + 0.2 * i, 200, "worker", 50.0, 1e9) for i in range(50, 100)]
    run = gpufeed.load(make_run(processes=procs, meta={"end_time": 1020.0}))
    edges = time_bins(run, *run_span(run), most=1200)
    cpu = role_totals(run, edges, "cpu")
    assert cpu["worker"].dropna().median() == pytest.approx(50.0)
    assert cpu["worker"].isna().sum() > 10  # where it did not exist
    charted = role_totals(run, edges, "cpu", absent=0.0)  # a stacked chart draws it as 0 there
    assert charted["worker"].isna().sum() == 0 and (charted["worker"] == 0).sum() > 10


def test_binned_mean_leaves_empty_bins_and_unknown_values_out():
    from gpufeed.analysis.stats import binned_mean

    edges = np.array([0.0, 1.0, 2.0, 3.0])
    means = binned_mean([0.5, 0.6, 2.5, 2.7, np.nan], [1.0, 3.0, 5.0, np.nan, 9.0], edges)
    assert means[0] == 2.0 and np.isnan(means[1]) and means[2] == 5.0
