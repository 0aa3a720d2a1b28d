"""DataLoaderBottleneck: share = wait / whole step; speedup = step / (step - wait); sized advice."""

from __future__ import annotations

import json
import re

import pytest
from rule_runs import RunBuilder, healthy

from gpufeed.analysis.rules import run_rules

RULE = "DataLoaderBottleneck"


def fired(run, rule=RULE, **overrides):
    return [f for f in run_rules(run, **overrides) if f.rule == rule]


def test_a_loop_waiting_83_of_97_ms_has_share_0_856_and_at_most_speedup_6_9(
    builder: RunBuilder,
) -> None:
    builder.steps([0.097] * 100, waits=0.083).process(1000, "main", 30.0).process(
        2000, "worker", 98.0
    )
    (f,) = fired(builder.build())
    assert f.evidence["data_wait_share"] == pytest.approx(83 / 97, abs=1e-3)
    assert f.evidence["max_speedup"] == pytest.approx(97 / 14, rel=1e-3)  # every wait removed
    assert f.severity == "critical"


def test_the_expected_speedup_is_what_the_recommended_workers_give(builder: RunBuilder) -> None:
    builder.steps([0.097] * 100, waits=0.083).process(1000, "main", 30.0).process(
        2000, "worker", 98.0
    )
    (f,) = fired(builder.build())
    # 1 worker makes a batch in 97 ms; 7 make one every 13.9 ms, under the 14 ms of compute, and
    # taking each from a worker costs about 1 ms (min_wait_ms): a step of 15 ms
    assert f.evidence["recommended_num_workers"] == 7
    assert f.est_speedup == pytest.approx(97 / (14 + 1), rel=1e-3)
    assert f.evidence["est_speedup_basis"].startswith("num_workers=7: a batch takes 97 ms")


def test_workers_the_cores_cannot_run_at_once_are_not_counted_in_the_speedup(
    builder: RunBuilder,
) -> None:
    # 2 cores, the training process loading every batch on a CPU: one worker is all there is
    # room for, and it makes a batch in the 30 ms the training process took
    builder.cpu_count = 2
    builder.steps([0.040] * 100, waits=0.030, wait_cpu=97.0).process(1000, "main", 100.0)
    (f,) = fired(builder.build())
    assert f.evidence["recommended_num_workers"] == 1
    assert f.est_speedup == pytest.approx(40 / (30 + 1), rel=1e-3)
    assert f.est_speedup < f.evidence["max_speedup"] == pytest.approx(4.0, rel=1e-3)
    # CPUBottleneck, which blames the training process, expects what the same workers give
    (cpu,) = fired(builder.build(), rule="CPUBottleneck")
    assert cpu.est_speedup == f.est_speedup
    assert cpu.evidence["est_speedup_basis"] == f.evidence["est_speedup_basis"]


def test_busy_workers_get_a_worker_count_sized_from_cores_and_step_times(
    builder: RunBuilder,
) -> None:
    builder.steps([0.097] * 100, waits=0.083).process(1000, "main", 30.0).process(
        2000, "worker", 98.0
    )
    (f,) = fired(builder.build())
    # 1 worker delivers a batch every 97 ms; 14 ms of compute needs ceil(97/14) = 7 workers (8 cores).
    assert "num_workers=7" in f.recommendation
    assert f.evidence["num_workers"] == 1 and f.evidence["worker_cpu_pct"] == 98.0


def test_without_workers_it_suggests_moving_loading_into_workers(builder: RunBuilder) -> None:
    builder.steps([0.1] * 100, waits=0.06).process(1000, "main", 100.0)
    (f,) = fired(builder.build())
    assert "now 0" in f.recommendation
    assert "num_workers=3" in f.recommendation  # ceil(60/40) + 1
    # no workers: their count is a whole 0 and there is no worker CPU to show
    assert repr(f.evidence["num_workers"]) == "0" and "worker_cpu_pct" not in f.evidence


@pytest.mark.parametrize("wait_cpu", [4.0, 97.0])
def test_without_workers_a_training_thread_asleep_in_its_waits_points_at_storage(
    wait_cpu: float,
) -> None:
    # 2 cores, steps of 300 ms waiting 200: about 3 workers needed, room for 1 on the cores.
    b = RunBuilder(cpu_count=2).steps([0.3] * 100, waits=0.2, wait_cpu=wait_cpu)
    (f,) = fired(b.process(1000, "main", 40.0).build())
    if wait_cpu < 30:  # measured asleep: storage or latency, and waiting workers need no core
        assert "on a CPU only 4% of the time it waits" in f.recommendation
        assert "set num_workers=3 (workers that wait need no core each)" in f.recommendation
        assert "cut the CPU cost" not in f.recommendation
    else:  # measured loading: as many workers as the cores have room for, and cut the cost
        assert "Set num_workers=1" in f.recommendation and "about 3 needed" in f.recommendation
        assert "cut the CPU cost per sample" in f.recommendation


def test_idle_workers_point_at_storage_latency_not_cpu(builder: RunBuilder) -> None:
    builder.steps([0.1] * 100, waits=0.05).process(1000, "main", 50.0)
    for w in range(2):
        builder.process(2000 + w, "worker", 3.0)
    (f,) = fired(builder.build())
    assert "mostly idle" in f.recommendation and "num_workers=4" in f.recommendation


@pytest.mark.parametrize("wait_cpu", [60.0, 5.0, float("nan")])
def test_idle_workers_with_a_busy_training_thread_point_at_the_hand_over(wait_cpu: float) -> None:
    b = RunBuilder().steps([0.1] * 100, waits=0.05, wait_cpu=wait_cpu).process(1000, "main", 50.0)
    for w in range(2):
        b.process(2000 + w, "worker", 20.0)
    (f,) = fired(b.build())
    assert "mostly idle (2 workers at 20% CPU each)" in f.recommendation
    if wait_cpu == 60.0:  # measured: the training thread works through its waits, the workers don't
        assert "on a CPU 60% of the time it waits: receiving the batches" in f.recommendation
        assert "return tensors from the Dataset or collate_fn" in f.recommendation
        assert "storage" not in f.recommendation and "num_workers=" not in f.recommendation
        (f,) = fired(b.build(), **{RULE: {"receiving_wait_cpu": 70.0}})  # a stricter threshold
        assert "wait on storage or latency" in f.recommendation
    else:  # asleep, or not measured: storage or latency, as before
        assert (
            "wait on storage or latency" in f.recommendation and "num_workers=4" in f.recommendation
        )


def _cpu_bound(cores: int, workers: int, cpu: float, main: float, wait: float = 0.06):
    """A run on `cores` cores whose steps (100 ms) wait `wait` s for `workers` loader workers
    at `cpu`% each; its training process runs at `main`%."""
    b = RunBuilder(cpu_count=cores).steps([0.1] * 100, waits=wait).process(1000, "main", main)
    for w in range(workers):
        b.process(2000 + w, "worker", cpu)
    return b.build()


def test_workers_busy_most_of_a_core_are_not_idle_and_get_no_more_than_the_cores_hold() -> None:
    # 16 cores, 15 workers at 70% each, steps waiting half their time: about 30 workers would end
    # the wait, but each takes 0.7 of a core, and the 15 cores beside the training process's
    # leave room for 21 (not 15: workers below the CPU-bound level are not counted a core each).
    (f,) = fired(_cpu_bound(16, 15, 70.0, 30.0, wait=0.05))
    assert "mostly idle" not in f.recommendation and "storage" not in f.recommendation
    assert f.recommendation.startswith(
        "The loader workers are busy (15 workers at 70% CPU each, 16 cores) and about 30 would be "
        "needed, more than the 21 the cores leave room for per training process"
    )
    assert "cut the CPU cost per sample" in f.recommendation
    assert "meanwhile set num_workers=21" in f.recommendation
    (f,) = fired(_cpu_bound(16, 15, 90.0, 30.0, wait=0.05))  # CPU-bound: a core each
    assert "more than the 15 the cores leave room for" in f.recommendation
    (f,) = fired(_cpu_bound(16, 15, 70.0, 30.0, wait=0.05), **{RULE: {"idle_worker_cpu": 75.0}})
    assert "mostly idle" in f.recommendation and "num_workers=30" in f.recommendation
    (f,) = fired(_cpu_bound(16, 4, 70.0, 30.0, wait=0.05))  # room on the cores: sized, not capped
    assert f.recommendation.startswith("Set num_workers=8 (4 workers at 70% CPU each, 16 cores)")


def test_workers_whose_cpu_was_not_sampled_get_a_count_and_no_claim_about_their_cpu() -> None:
    # the DataLoader hooks saw 2 workers, but the process samples are missing (a lost store)
    b = RunBuilder(cpu_count=16).steps([0.1] * 100, waits=0.05)
    b.ranks[0]["loader_workers"] = 2
    (f,) = fired(b.build())
    assert f.recommendation.startswith(
        "Set num_workers=4 (now 2, 16 cores; the workers' CPU was not recorded"
    )
    assert "nan" not in f.recommendation.lower() and "idle" not in f.recommendation
    assert "worker_cpu_pct" not in f.evidence
    json.dumps(f.evidence, allow_nan=False)  # strict JSON: no NaN in what report --json writes


def test_workers_not_sampled_on_cores_with_no_room_are_not_told_to_keep_their_count() -> None:
    # 2 cores leave room for 1 worker, which there is: "set num_workers=1 (now 1)" said nothing
    b = RunBuilder(cpu_count=2).steps([0.1] * 100, waits=0.05)
    b.ranks[0]["loader_workers"] = 1
    (f,) = fired(b.build())
    assert "num_workers=" not in f.recommendation
    assert f.recommendation.startswith(
        "The 2 cores leave no room for more than the 1 worker now (the workers' CPU was not "
        "recorded"
    )


def test_a_wait_shorter_than_a_workers_hand_over_gets_no_worker_advice() -> None:
    # 300 µs steps waiting 80 µs (27%): moving that into a worker costs more than it saves (the
    # advice to set num_workers=1 made such a loop 4x slower)
    tiny = RunBuilder(cpu_count=16).steps([0.0003] * 200, waits=0.00008)
    (f,) = fired(tiny.process(1000, "main", 100.0).build())
    assert "num_workers" not in f.recommendation and "larger batches" in f.recommendation
    assert "(80 µs of 300 µs)" in f.recommendation  # not "(0 of 0 ms)"
    assert f.evidence["data_wait_share"] == pytest.approx(0.8 / 3, abs=1e-3)  # still reported
    (f,) = fired(tiny.build(), **{RULE: {"min_wait_ms": 0.05}})
    assert "num_workers=2" in f.recommendation
    # 3 ms steps waiting 1.2 ms: workers advised, the times in ms with a decimal
    (f,) = fired(RunBuilder(cpu_count=16).steps([0.003] * 200, waits=0.0012).build())
    assert "num_workers=" in f.recommendation and "(1.2 ms of 3.0 ms)" in f.recommendation


def test_when_cores_run_out_it_says_to_cut_cpu_per_sample() -> None:
    # 4 cores, one kept by the training process: room for 3 workers where about 20 are needed
    (f,) = fired(_cpu_bound(4, 2, 99.0, 20.0, wait=0.09))
    assert "pre-resized shards" in f.recommendation
    assert "meanwhile set num_workers=3" in f.recommendation
    (f,) = fired(_cpu_bound(4, 3, 99.0, 20.0, wait=0.09))  # there already: nothing to set
    assert "more than the 3 the cores leave room for" in f.recommendation
    assert "set num_workers" not in f.recommendation


@pytest.mark.parametrize(
    "cores, workers, cpu, main",
    [
        (8, 2, 97.0, 40.0),
        (16, 4, 95.0, 60.0),
        (2, 1, 97.0, 30.0),
        (16, 15, 90.0, 50.0),
        (8, 2, 82.0, 40.0),  # CPU-bound for both: they share the 80% line
    ],
)
def test_both_cpu_rules_advise_the_same_worker_count(
    cores: int, workers: int, cpu: float, main: float
) -> None:
    # Both fire on CPU-bound workers: one number of workers (or none, where the cores run out)
    found = {f.rule: f.recommendation for f in run_rules(_cpu_bound(cores, workers, cpu, main))}
    counts = {r: re.findall(r"num_workers=(\d+)", found[r]) for r in ("CPUBottleneck", RULE)}
    assert counts["CPUBottleneck"] == counts[RULE]
    assert len(counts[RULE]) <= 1 and all(int(n) > workers for n in counts[RULE])


def test_the_worst_rank_is_named(builder: RunBuilder) -> None:
    builder.steps([0.1] * 100, waits=0.0, rank=0).steps([0.1] * 100, waits=0.05, rank=1)
    (f,) = fired(builder.build())
    assert f.evidence["rank"] == 1 and f.evidence["data_wait_share"] == pytest.approx(0.5)
    assert f.evidence["mean_share_all_ranks"] == pytest.approx(0.25)


def test_threshold_is_respected_and_overridable(builder: RunBuilder) -> None:
    run = builder.steps([0.1] * 100, waits=0.008).build()
    assert fired(run) == []
    (f,) = fired(run, DataLoaderBottleneck={"threshold": 0.05})
    assert f.severity == "warning"


def test_warm_up_steps_are_not_counted(builder: RunBuilder) -> None:
    # 30 slow first steps (workers starting) then a healthy loop: no finding with a long enough warm-up.
    durations = [0.5] * 30 + [0.1] * 200
    waits = [0.45] * 30 + [0.001] * 200
    run = builder.steps(durations, waits=waits).build()
    assert fired(run, warmup={"steps": 30}) == []
    assert fired(run, warmup={"steps": 0, "seconds": 0})  # counted, the same run fires


def test_warm_up_never_skips_more_than_half_the_steps(builder: RunBuilder) -> None:
    # A short job that waits all along still gets its diagnosis even under a huge warm-up.
    run = builder.steps([0.1] * 20, waits=0.05).build()
    (f,) = fired(run, warmup={"steps": 1000, "seconds": 1000})
    assert f.evidence["steps"] == 10


def test_quiet_on_a_healthy_run() -> None:
    assert fired(healthy(RunBuilder()).build()) == []


def test_advice_fits_the_data_type_no_jpeg_advice_for_tokens() -> None:
    def advice(kind: str | None) -> str:
        b = RunBuilder(cpu_count=2).steps([0.1] * 100, waits=0.09)
        for rank in b.ranks:
            rank["batch_kind"] = kind
        return run_rules(b.build())[0].recommendation

    text = advice("other")  # e.g. token ids: (batch, sequence)
    assert "Set num_workers=" in text and "may not keep up" in text
    assert "JPEG" not in text and "gpufeed pack" not in text and "tokenize" in text
    assert "JPEG" in advice("image") and "JPEG" in advice(None)  # images, or not recorded


def test_on_several_hosts_the_worker_budget_is_each_hosts_cores_over_its_own_ranks() -> None:
    # Two 16-core nodes with 4 ranks each: 3 workers fit per rank (16 // 4 - 1), not 1
    # (16 cores over all 8 ranks).
    from gpufeed.analysis.combine import combine

    parts = []
    for host, ranks in (("node-a", range(4)), ("node-b", range(4, 8))):
        b = RunBuilder(cpu_count=16, host=host)
        for rank in ranks:
            b.steps([0.1] * 100, waits=0.09, rank=rank)
        parts.append(b.build())
    run = combine(parts)
    assert run.meta["host_cpu_counts"] == {"node-a": 16, "node-b": 16}
    (f,) = fired(run)
    assert "Set num_workers=3 " in f.recommendation

    small = RunBuilder(cpu_count=8, host="node-c")  # a smaller node bounds the advice
    for rank in range(8, 12):
        small.steps([0.1] * 100, waits=0.095, rank=rank)  # and waits the most: the finding's rank
    (f,) = fired(combine([*parts, small.build()]))
    assert "Set num_workers=1 " in f.recommendation
    assert "itself; 8 cores)" in f.recommendation and f.evidence["cpu_count"] == 8


def test_workers_seen_on_hosts_that_sample_at_their_own_times_are_counted_per_host() -> None:
    # No DataLoader hooked (the count comes from process samples), 2 hosts x 2 ranks x 3
    # workers; node-b's sampler ticks 0.05 s after node-a's: each time stamp holds one host's
    # workers, and counting them per time over all ranks halved the workers (and doubled
    # their CPU each).
    from gpufeed.analysis.combine import combine
    from gpufeed.analysis.rules.context import Context

    parts = []
    for h, host in enumerate(("node-a", "node-b")):
        b = RunBuilder(cpu_count=16, host=host)
        for rank in (2 * h, 2 * h + 1):
            b.steps([0.1] * 100, waits=0.04, rank=rank, batch_kind=None)
            b.process(1000 + rank, "main", 100.0)
            for k in range(3):
                b.process(2000 + 10 * rank + k, "worker", 50.0)
        run = b.build()
        run.processes["time"] += 0.05 * h
        parts.append(run)
    ctx = Context(combine(parts))
    assert ctx.worker_count == 3.0 and ctx.worker_cpu == 50.0


def _full_host(workers: int, worker_cpu: float, main_cpu: float = 10.0) -> RunBuilder:
    """A 2-core host at 100% CPU whose steps wait on `workers` loader workers."""
    b = RunBuilder(cpu_count=2).steps([0.1] * 100, waits=0.07).metric("cpu.util", 100.0)
    b.process(1000, "main", main_cpu)
    for w in range(workers):
        b.process(2000 + w, "worker", worker_cpu)
    return b


def test_many_workers_sharing_a_full_host_are_cpu_bound_not_idle() -> None:
    # 8 workers at 23% each keep 1.8 of 2 cores busy: starved, not waiting on storage. More
    # workers (the old advice was num_workers=27) would only share the same two cores.
    (f,) = fired(_full_host(8, 23.0).build())
    assert "mostly idle" not in f.recommendation and "num_workers=" not in f.recommendation
    assert f.recommendation.startswith(
        "The loader workers are CPU-bound: they keep 1.8 of the 2 cores busy (8 workers at 23% "
        "CPU each) and the host's CPU is 100% busy"
    )
    assert "more workers would only share the same cores" in f.recommendation
    assert f.evidence["host_cpu_p50"] == 100.0


def test_a_worker_starved_by_other_work_names_that_work() -> None:
    # One worker gets 62% of a core because other processes keep 1.3 cores busy.
    (f,) = fired(_full_host(1, 62.0, main_cpu=5.0).build())
    assert "(1 worker at 62% CPU)" in f.recommendation
    assert "1.3 cores of it by processes outside the run" in f.recommendation
    assert "stop or move the other workloads" in f.recommendation


def test_idle_workers_on_a_host_busy_with_other_work_still_point_at_storage() -> None:
    # 2 workers at 3% on a full host: the host is busy, but not with them.
    (f,) = fired(_full_host(2, 3.0).build())
    assert "mostly idle" in f.recommendation and "num_workers=" in f.recommendation


def test_on_a_full_host_of_several_ranks_the_cores_are_the_hosts_and_the_count_per_rank() -> None:
    b = RunBuilder(cpu_count=16).metric("cpu.util", 95.0)
    for rank in range(4):
        b.steps([0.1] * 100, waits=0.07, rank=rank).process(1000 + rank, "main", 50.0)
        for w in range(4):
            b.process(2000 + 10 * rank + w, "worker", 60.0)
    (f,) = fired(b.build())
    assert (
        "they keep 9.6 of the 16 cores busy (4 workers per training process at 60% CPU each)"
        in f.recommendation
    )


def test_idle_workers_of_a_validation_loader_do_not_make_busy_training_workers_look_idle() -> None:
    # 8 training workers at 95% and a persistent validation loader's 8 workers idle at 0.5%: the
    # mean over all 16 (48%) read as "mostly idle, waiting on storage".
    b = RunBuilder(interval=0.2, cpu_count=16).metric("cpu.util", 54.0)
    b.steps([0.1] * 300, waits=0.05, wait_cpu=2.0)
    b.ranks[-1]["loader_workers"] = 8  # what the hooks saw feeding training steps
    b.process(1000, "main", 100.0)
    for w in range(8):
        b.process(2000 + w, "worker", 95.0).process(3000 + w, "worker", 0.5)
    (f,) = fired(b.build())
    assert "mostly idle" not in f.recommendation
    assert "CPU-bound (8 workers at 95% CPU each" in f.recommendation
    assert f.evidence["worker_cpu_pct"] == pytest.approx(95.5, abs=0.1)


def _quota_run(sampled_cores: int, util: float) -> RunBuilder:
    """A run that may use 16 cores whose sampler averages `sampled_cores` per-core series at
    `util` %: 63 loader workers at 24% each (15 cores) feed steps that wait 60 ms of 100."""
    b = RunBuilder(cpu_count=16).steps([0.1] * 100, waits=0.06).metric("cpu.util", util)
    for core in range(sampled_cores):
        b.metric("cpu.core", util, str(core))
    b.process(1000, "main", 88.0)
    for w in range(63):
        b.process(2000 + w, "worker", 24.0)
    return b


def test_workers_filling_a_containers_cpu_limit_are_cpu_bound_as_on_a_bare_host() -> None:
    # A 16-CPU limit on a 64-core node: the sampler averages all 64 cores (25% busy), but the 16
    # the run may use are full. The old advice read the workers as idle: num_workers=158.
    bare = fired(_quota_run(16, 100.0).build())[0].recommendation
    (f,) = fired(_quota_run(64, 25.0).build())
    assert f.recommendation == bare
    assert f.recommendation.startswith(
        "The loader workers are CPU-bound: they keep 15.1 of the 16 cores busy (63 workers at 24% "
        "CPU each) and the host's CPU is 100% busy, so more workers would only share the same cores"
    )
    assert f.evidence["host_cpu_p50"] >= 99


def _busy_node(limit: int, wait: float, main_cpu: float, workers: int, worker_cpu: float):
    """A run with a `limit`-CPU quota on a 64-core node 60% busy, mostly with other pods."""
    b = RunBuilder(cpu_count=limit).steps([0.1] * 100, waits=wait).metric("cpu.util", 60.0)
    for core in range(64):
        b.metric("cpu.core", 60.0, str(core))
    b.process(1000, "main", main_cpu)
    for w in range(workers):
        b.process(2000 + w, "worker", worker_cpu)
    (f,) = fired(b.build())
    return f


def test_other_tenants_of_a_node_do_not_fill_a_containers_cpu_limit() -> None:
    # The run's 4 cores of 16 are not full: the idle workers still point at storage.
    f = _busy_node(16, 0.06, 80.0, 8, 40.0)
    assert f.evidence["host_cpu_p50"] < 90
    assert "mostly idle" in f.recommendation and "CPU-bound" not in f.recommendation


def test_a_busy_node_with_idle_cores_to_spare_leaves_a_containers_limit_free() -> None:
    # An 8-CPU limit, 25 cores of the node idle, the run using 3 of its 8: other pods do not use
    # the run's quota, so its free cores take more workers.
    f = _busy_node(8, 0.04, 100.0, 2, 100.0)
    assert f.evidence["host_cpu_p50"] < 50
    assert "Set num_workers=" in f.recommendation
    assert "other workloads" not in f.recommendation


def test_workers_that_each_keep_three_cores_busy_get_room_counted_in_cores() -> None:
    # 16 cores, 4 workers at 300% (threads inside each): 12 cores, the training process 1, 3
    # free. One more worker fits, not three (the old num_workers=7 wanted 21 cores).
    b = RunBuilder(cpu_count=16).steps([0.1] * 100, waits=0.06).metric("cpu.util", 100 * 13 / 16)
    b.process(1000, "main", 100.0)
    for w in range(4):
        b.process(2000 + w, "worker", 300.0)
    found = {f.rule: f.recommendation for f in run_rules(b.build())}
    for rule in ("CPUBottleneck", RULE):
        # 5 workers at 3 cores each keep 15 busy: 15 one-thread workers do the same
        assert re.findall(r"num_workers=(\d+)", found[rule]) == ["5", "15"], rule
        assert "keeps the 15 cores busy that 5 workers at 3.0 cores each do" in found[rule]
        assert "run one thread per worker (cv2.setNumThreads(1)" in found[rule]
        assert "worker_init_fn" in found[rule]
    assert "about 10 would be needed, more than the 5 the cores leave room for" in found[RULE]
    # workers within a core each are not told about threads
    (f,) = fired(_cpu_bound(16, 4, 95.0, 60.0))
    assert "one thread per worker" not in f.recommendation


def test_batches_from_no_dataloader_get_the_pipelines_parallelism_not_num_workers() -> None:
    # A generator (DALI, webdataset, get_batch) feeds the steps: no DataLoader, no num_workers.
    b = RunBuilder(cpu_count=16).steps([0.1] * 100, waits=0.06, batch_kind=None)
    (f,) = fired(b.process(1000, "main", 100.0).build())
    assert "num_workers" not in f.recommendation
    assert f.recommendation.startswith(
        "The batches come through no DataLoader gpufeed saw (a generator, or a DALI or webdataset "
        "pipeline), so how many workers prepare them is unknown"
    )
    assert "about 3 at once" in f.recommendation and "`gpufeed.data.Loader`" in f.recommendation
    assert f.evidence["num_workers"] == "unknown"
    # the same steps fed by a DataLoader with num_workers=0 are told the count
    b = RunBuilder(cpu_count=16).steps([0.1] * 100, waits=0.06, batch_kind="other")
    (f,) = fired(b.process(1000, "main", 100.0).build())
    assert "Set num_workers=3 in the DataLoader (now 0" in f.recommendation


@pytest.mark.parametrize("cpu", [95.0, 30.0])
def test_worker_processes_beside_no_dataloader_are_not_told_num_workers(cpu: float) -> None:
    # A generator over multiprocessing.Pool(4): its processes are sampled as workers, but no
    # DataLoader fed the steps, so there is no num_workers or prefetch_factor to set.
    b = RunBuilder(cpu_count=16).steps([0.1] * 100, waits=0.06, batch_kind=None)
    b.metric("cpu.util", 40.0).process(1000, "main", 100.0)
    for w in range(4):
        b.process(2000 + w, "worker", cpu)
    found = {f.rule: f for f in run_rules(b.build())}
    f = found[RULE]
    assert "num_workers" not in f.recommendation and "prefetch_factor" not in f.recommendation
    assert f"(4 workers at {cpu:.0f}% CPU each seen beside it)" in f.recommendation
    assert f.evidence["num_workers"] == "unknown" and f.evidence["worker_processes_seen"] == 4
    if "CPUBottleneck" in found:
        text = found["CPUBottleneck"].recommendation
        assert "num_workers" not in text and "more worker processes or decode threads" in text


def test_one_thread_advice_on_a_full_host_gives_the_count_it_implies() -> None:
    # 5 workers at 290% on a full 16-core host: no worker count is advised, so the one-thread
    # advice gives its own (it said "the count above" where there was none).
    b = RunBuilder(cpu_count=16).steps([0.1] * 100, waits=0.06).metric("cpu.util", 99.0)
    b.process(1000, "main", 100.0)
    for w in range(5):
        b.process(2000 + w, "worker", 290.0)
    for f in run_rules(b.build()):
        if f.rule in (RULE, "CPUBottleneck"):
            assert "the count above" not in f.recommendation
            assert "about num_workers=14 keeps the 14 cores busy that 5 workers at 2.9" in (
                f.recommendation
            )


@pytest.mark.parametrize("cuda", [False, True])
def test_gpu_augmentation_is_advised_only_to_runs_that_used_a_gpu(cuda: bool) -> None:
    # CPU-bound workers on a full host; NVML read nothing, the training process did (not) use CUDA
    b = RunBuilder(cpu_count=16).steps([0.1] * 100, waits=0.06).metric("cpu.util", 98.0)
    b.ranks[0]["cuda"] = cuda
    b.process(1000, "main", 100.0)
    for w in range(15):
        b.process(2000 + w, "worker", 99.0)
    found = {f.rule: f.recommendation for f in run_rules(b.build())}
    for rule in ("CPUBottleneck", RULE):
        assert "reduced-size JPEG decode" in found[rule]
        assert ("augmentation on the GPU" in found[rule]) is cuda


def test_a_hand_edited_core_count_that_cannot_be_one_falls_back_to_the_sampled_cores() -> None:
    # meta.json with cpu_count -4, or host_cpu_counts a string: the per-core series count (2)
    b = RunBuilder(cpu_count=-4).steps([0.1] * 100, waits=0.06).process(1000, "main", 100.0)
    for core in range(2):
        b.metric("cpu.core", 50.0, str(core))
    (f,) = fired(b.build())
    assert "itself; 2 cores)" in f.recommendation and f.evidence["cpu_count"] == 2
    (f,) = fired(b.build(cpu_count=16, host_cpu_counts="16"))
    assert "itself; 16 cores)" in f.recommendation


def test_the_rules_call_steps_input_bound_where_diagnose_and_tune_do() -> None:
    from gpufeed.advise import diagnose, tune
    from gpufeed.analysis.rules.dataloader_bottleneck import DataLoaderBottleneck
    from gpufeed.analysis.rules.params import INPUT_BOUND

    assert INPUT_BOUND == diagnose.WAITING == tune.WAITING
    assert DataLoaderBottleneck.params["threshold"].default == INPUT_BOUND
