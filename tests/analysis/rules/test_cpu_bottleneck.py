"""CPUBottleneck: attributed to the role that burns the CPU, never just 'a core above 90%'."""

from __future__ import annotations

import numpy as np
from rule_runs import RunBuilder, healthy

from gpufeed.analysis.rules import Context, run_rules
from gpufeed.analysis.rules.cpu_bottleneck import CPUBottleneck


def fired(run, **overrides):
    return [f for f in run_rules(run, **overrides) if f.rule == "CPUBottleneck"]


def test_saturated_workers_while_steps_wait_are_blamed(builder: RunBuilder) -> None:
    builder.steps([0.1] * 100, waits=0.06).process(1000, "main", 40.0)
    for w in range(2):
        builder.process(2000 + w, "worker", 97.0)
    (f,) = fired(builder.build())
    assert f.evidence["role"] == "worker" and f.evidence["worker_cores"] == 1.94
    assert "num_workers=" in f.recommendation


def test_sleeping_workers_are_not_a_cpu_bottleneck(builder: RunBuilder) -> None:
    builder.steps([0.1] * 100, waits=0.06).process(1000, "main", 40.0).process(2000, "worker", 2.0)
    assert fired(builder.build()) == []


def test_busy_cores_alone_do_not_fire(builder: RunBuilder) -> None:
    healthy(builder)
    builder.metric("cpu.core", 100.0, "0")  # one hot core, no wait, GPU busy
    builder.gpu(95.0)
    assert fired(builder.build()) == []


def test_main_process_loading_with_zero_workers_is_found_from_cpu_during_waits() -> None:
    b = RunBuilder(interval=0.1).steps([0.3] * 60, waits=0.2)
    # The training process burns a core while it waits (it decodes), and half of one while computing.
    t = b.times()
    steps = b.build().steps

    def busy(rel: np.ndarray) -> np.ndarray:
        abs_t = rel + t[0]
        out = np.empty_like(abs_t)
        for i, te in enumerate(abs_t):
            ts = np.linspace(te - 0.1, te, 50)
            k = np.searchsorted(steps["start"].to_numpy(), ts, side="right") - 1
            in_wait = (k >= 0) & (ts < steps["start"].to_numpy()[k.clip(0)] + 0.2)
            out[i] = 100.0 * in_wait.mean() + 50.0 * (1 - in_wait.mean())
        return out

    b.process(1000, "main", busy)
    (f,) = fired(b.build())
    assert f.evidence["role"] == "main"
    assert abs(f.evidence["main_cpu_while_waiting_pct"] - 100.0) < 5


def test_gpu_runs_with_a_busy_gpu_are_not_cpu_bound(builder: RunBuilder) -> None:
    builder.steps([0.1] * 100, waits=0.06).gpu(95.0)
    builder.process(2000, "worker", 99.0)
    assert fired(builder.build()) == []


def test_launch_bound_training_process_on_an_idle_gpu(builder: RunBuilder) -> None:
    builder.steps([0.02] * 300, waits=0.0).gpu(30.0).process(1000, "main", 100.0)
    (f,) = fired(builder.build())
    assert f.evidence["role"] == "main" and "torch.compile" in f.recommendation


def test_other_processes_saturating_the_host(builder: RunBuilder) -> None:
    builder.steps([0.1] * 100, waits=0.0).gpu(20.0).process(1000, "main", 30.0)
    builder.metric("cpu.util", 98.0)
    (f,) = fired(builder.build())
    assert f.evidence["role"] == "other"


def _main_loading(cpu_count: int, waiting: float, computing: float, **shape: float):
    """A one-rank run on a host of `cpu_count` cores, as `_loading_rank` makes it."""
    b = RunBuilder(interval=0.1, cpu_count=cpu_count)
    return _loading_rank(b, 0, waiting, computing, **shape).build()


def _loading_rank(
    b: RunBuilder,
    rank: int,
    waiting: float,
    computing: float,
    noise: float = 0.0,
    step: float = 0.3,
    wait: float = 0.2,
    steps: int = 60,
) -> RunBuilder:
    """`b` with one more rank whose training process (no workers) uses `waiting`% CPU while its
    steps (`step` s, of which `wait` s waiting for data) wait and `computing`% otherwise, sampled
    every 0.1 s, plus Gaussian noise of `noise` points."""
    b.steps([step] * steps, waits=wait, rank=rank)
    t = b.times()
    made = b.build().steps
    made = made[made["rank"] == rank]
    rng = np.random.default_rng(1)

    def cpu(rel: np.ndarray) -> np.ndarray:
        out = np.empty_like(rel)
        for i, te in enumerate(rel + t[0]):
            ts = np.linspace(te - 0.1, te, 50)
            k = np.searchsorted(made["start"].to_numpy(), ts, side="right") - 1
            f = ((k >= 0) & (ts < made["start"].to_numpy()[k.clip(0)] + wait)).mean()
            out[i] = waiting * f + computing * (1 - f)
        return np.clip(out + noise * rng.standard_normal(len(out)), 0.0, None)

    return b.process(1000 + rank, "main", cpu)


def _loading_nodes(*nodes: tuple[str, float, float]):
    """A run over 16-core hosts (name, host CPU %, CPU % of its one rank's training process
    while it loads its own data; 10% otherwise), combined as `gpufeed` combines per-host runs."""
    from gpufeed.analysis.combine import combine

    parts = []
    for rank, (host, util, waiting) in enumerate(nodes):
        b = RunBuilder(interval=0.1, cpu_count=16, host=host).metric("cpu.util", util)
        parts.append(_loading_rank(b, rank, waiting, 10.0).build())
    return combine(parts)


def test_a_training_process_starved_on_a_full_host_is_found_on_that_host() -> None:
    # 60% while loading is "saturated" only where the host is full (half of the 80% threshold):
    # on node-b, at 98%, though the two hosts' pooled median CPU (64%) is not full.
    (f,) = fired(_loading_nodes(("node-a", 30.0, 60.0), ("node-b", 98.0, 60.0)))
    assert f.evidence["role"] == "main" and f.evidence["host"] == "node-b"
    assert f.evidence["host_cpu_p50"] == 98.0 and f.evidence["cpu_count"] == 16
    assert "the training processes on node-b run at 60% CPU each" in f.recommendation


def test_a_full_host_does_not_starve_the_training_processes_of_another() -> None:
    # Two full hosts whose ranks load at 40% (below half the threshold even there), and a third at
    # 30% whose rank loads at 60%: no process is CPU-bound where it runs, though the pooled median
    # CPU (95%) is full and the pooled fit (47%) is above half the threshold.
    run = _loading_nodes(("node-a", 95.0, 40.0), ("node-b", 96.0, 40.0), ("node-c", 30.0, 60.0))
    assert [f for f in fired(run) if f.evidence["role"] == "main"] == []


def test_a_launch_bound_training_process_is_judged_on_its_own_host() -> None:
    # An idle GPU, no data wait, training processes at 60%: starved, so CPU-bound, on the full node.
    from gpufeed.analysis.combine import combine

    parts = []
    for rank, (host, util) in enumerate((("node-a", 30.0), ("node-b", 98.0))):
        b = RunBuilder(cpu_count=16, host=host).steps([0.1] * 100, rank=rank).gpu(20.0)
        parts.append(b.process(1000 + rank, "main", 60.0).metric("cpu.util", util).build())
    (f,) = fired(combine(parts))
    assert f.evidence["role"] == "main" and f.evidence["host"] == "node-b"
    assert f.recommendation.startswith("The training processes on node-b run at 60% CPU each")


def test_cpu_while_waiting_is_clipped_to_what_the_process_can_use() -> None:
    # a fit beyond the host's cores (samples that overshoot, e.g. a late sampler tick)
    (f,) = fired(_main_loading(cpu_count=2, waiting=320.0, computing=10.0))
    assert f.evidence["main_cpu_while_waiting_pct"] <= 200.0
    low, high = map(float, f.evidence["main_cpu_while_waiting_range"].split("-"))
    assert low <= f.evidence["main_cpu_while_waiting_pct"] <= high <= 200.0


def test_a_weak_fit_is_a_range_and_blames_no_one() -> None:
    run = _main_loading(cpu_count=2, waiting=95.0, computing=40.0, noise=120.0)
    ctx = Context(run)
    loading, _ = ctx.main_cpu_split()
    low, high = ctx.main_cpu_waiting_range()
    busy = CPUBottleneck.params["busy"].default
    # the best fit says "saturated", but noisy samples leave the range well below that too
    assert loading >= busy and low < busy <= high and high - low > 20
    assert "CPUBottleneck" not in {f.rule for f in run_rules(run)}


def test_free_cores_are_shared_by_the_ranks_of_the_host() -> None:
    # 16 cores, 4 ranks with 2 busy workers each: 8 worker cores + 1.6 main cores, 6.4 free:
    # one more worker per rank (3 each, 16 processes in all), not 6 more for every rank.
    b = RunBuilder(cpu_count=16)
    for rank in range(4):
        b.steps([0.1] * 100, waits=0.06, rank=rank).process(1000 + rank, "main", 40.0)
        for w in range(2):
            b.process(2000 + 10 * rank + w, "worker", 100.0)
    (f,) = fired(b.build())
    assert "about 6 cores are still free" in f.recommendation
    assert "(num_workers=3)" in f.recommendation


def _node(host: str, cores: int, ranks: range, workers: int = 2, wait: float = 0.06):
    """One host of a multi-node run: each rank has a training process at 40% CPU and `workers`
    loader workers at 100%."""
    b = RunBuilder(cpu_count=cores, host=host)
    for rank in ranks:
        b.steps([0.1] * 100, waits=wait, rank=rank).process(1000 + rank, "main", 40.0)
        for w in range(workers):
            b.process(2000 + 10 * rank + w, "worker", 100.0)
    return b


def test_on_several_hosts_free_cores_are_counted_per_host() -> None:
    # Two 16-core nodes, each like the single host above (6.4 cores free, 4 ranks): one more
    # worker per rank. Their samples fall at the same instants, which must not add them up.
    from gpufeed.analysis.combine import combine

    nodes = [_node("node-a", 16, range(4)).build(), _node("node-b", 16, range(4, 8)).build()]
    (f,) = fired(combine(nodes))
    assert "about 6 cores are still free on node-a" in f.recommendation
    assert "(num_workers=3)" in f.recommendation and "of 16 cores on node-a" in f.recommendation

    # A third, 8-core node with as many ranks and workers has no core left: it bounds the advice.
    (f,) = fired(combine([*nodes, _node("node-c", 8, range(8, 12)).build()]))
    assert f.evidence["host"] == "node-c"
    assert "no cores are left on node-c" in f.recommendation


def test_outside_load_is_judged_on_each_host_with_its_own_cores() -> None:
    # A 32-core node at 60% and an 8-core node at 98%, each with one quiet rank and an idle GPU:
    # the small node is saturated by other work, though the two hosts' median is below 90%.
    from gpufeed.analysis.combine import combine

    parts = []
    for host, cores, util in (("node-a", 32, 60.0), ("node-b", 8, 98.0)):
        b = RunBuilder(cpu_count=cores, host=host)
        b.steps([0.1] * 100, waits=0.0, rank=len(parts)).gpu(20.0)
        b.process(1000 + len(parts), "main", 30.0).metric("cpu.util", util)
        parts.append(b.build())
    (f,) = fired(combine(parts))
    assert f.evidence["role"] == "other" and f.evidence["host"] == "node-b"
    assert f.evidence["host_cpu_p50"] == 98.0 and f.evidence["cpu_count"] == 8
    assert f.recommendation.startswith("node-b's CPU is 98% busy")
    assert "uses only 0.3 of its 8 cores" in f.recommendation


def test_the_sample_reaching_into_the_warm_up_does_not_sway_the_fit() -> None:
    # A cpu_transform-like loop: a full core while loading (100 of 122 ms per step), asleep
    # otherwise. The first sample of the steady state also covers the end of the warm-up, whose
    # waits the steady state does not list. Counted, that busy sample read as busy computing and
    # pulled the fit to 91% while loading.
    ctx = Context(_main_loading(cpu_count=2, waiting=100.0, computing=0.0, step=0.122, wait=0.1))
    (loading, computing), (low, high) = ctx.main_cpu_split(), ctx.main_cpu_waiting_range()
    assert abs(loading - 100.0) < 2 and computing < 5
    assert low > 97 and high < 103


def _phase_locked(wait_cpu: float):
    """Steps exactly one sampling interval long, 79 of their 100 ms waiting for data: every
    sample holds the same wait share, so a fit cannot tell waiting from computing. The training
    process's CPU is 78% in every sample; `wait_cpu` is what its thread used across its waits."""
    b = RunBuilder(interval=0.1, cpu_count=2).steps([0.1] * 100, waits=0.079, wait_cpu=wait_cpu)
    return b.process(1000, "main", 78.0).build()


def test_cpu_measured_across_each_wait_finds_a_loader_the_samples_cannot() -> None:
    assert fired(_phase_locked(np.nan)) == []  # fitted: no verdict
    (f,) = fired(_phase_locked(97.0))
    assert f.evidence["role"] == "main" and f.evidence["main_cpu_while_waiting_from"] == "measured"
    assert f.evidence["main_cpu_while_waiting_pct"] == 97.0
    assert f.evidence["main_cpu_while_computing_pct"] == "n/a"  # the samples still cannot tell
    assert "the training thread runs at 97% CPU (97-97%) while its steps wait" in f.recommendation


def test_a_training_thread_kept_off_its_core_by_other_load_is_still_cpu_bound() -> None:
    # Loading on a host where other work takes half the time: 55% on a CPU, 40% ready for one.
    b = RunBuilder(interval=0.1, cpu_count=2).steps([0.1] * 100, waits=0.079, wait_cpu=55.0)
    run = b.process(1000, "main", 50.0).build()
    run.steps["data_wait_ready"] = run.steps["data_wait"] * 0.40
    (f,) = fired(run)
    assert f.evidence["main_cpu_while_waiting_pct"] == 95.0
    assert f.evidence["main_ready_while_waiting_pct"] == 40.0
    assert "runs at 95% CPU (95-95%, 40 points of it waiting for a free core)" in f.recommendation


def test_a_training_process_asleep_while_it_waits_is_not_cpu_bound() -> None:
    # The same run, but the waits are spent asleep (reading from a slow disk): not a CPU problem.
    assert fired(_phase_locked(3.0)) == []
    loading, _ = Context(_phase_locked(3.0)).main_cpu_split()
    assert abs(loading - 3.0) < 1e-9


def test_one_free_core_is_said_in_the_singular() -> None:
    b = RunBuilder(cpu_count=4).steps([0.1] * 100, waits=0.06).process(1000, "main", 90.0)
    b.process(2000, "worker", 97.0).process(2001, "worker", 97.0)
    (f,) = fired(b.build())
    assert "about 1 core is still free: add loader workers (num_workers=3)" in f.recommendation


def test_workers_on_every_core_but_the_training_process_one_are_not_advised_more() -> None:
    # 15 workers at 90% and a training process at 50% leave 2 of 16 cores idle, but a 17th worker
    # would take the training process's own core: cut the cost per sample instead.
    b = RunBuilder(cpu_count=16).steps([0.1] * 100, waits=0.06).process(1000, "main", 50.0)
    for w in range(15):
        b.process(2000 + w, "worker", 90.0)
    (f,) = fired(b.build())
    assert "every core but one per training process" in f.recommendation
    assert "num_workers" not in f.recommendation and "pre-resized shards" in f.recommendation


def _full_host(workers: int, worker_cpu: float, main_cpu: float = 10.0):
    """A 2-core host at 100% CPU whose steps wait on `workers` loader workers."""
    b = RunBuilder(cpu_count=2).steps([0.1] * 100, waits=0.07).metric("cpu.util", 100.0)
    b.process(1000, "main", main_cpu)
    for w in range(workers):
        b.process(2000 + w, "worker", worker_cpu)
    return b.build()


def test_workers_that_together_fill_a_full_host_are_cpu_bound() -> None:
    # 8 workers at 23% each: no one of them looks busy, together they keep 1.8 of 2 cores busy.
    (f,) = fired(_full_host(8, 23.0))
    assert f.evidence["role"] == "worker" and f.evidence["worker_cores"] == 1.84
    assert f.title == "CPU-bound loader workers: 8 workers at 23% CPU each"
    assert "no cores are left: cut the CPU cost per sample" in f.recommendation


def test_cores_busy_with_other_work_are_not_counted_as_free() -> None:
    # The run uses 0.67 of 2 cores, but the host is full: the rest is other work, not free.
    (f,) = fired(_full_host(1, 62.0, main_cpu=5.0))
    assert "still free" not in f.recommendation
    assert f.evidence["outside_cores"] == 1.33
    assert "processes outside the run keep 1.3 of them busy: stop or move those" in f.recommendation


def test_idle_workers_on_a_full_host_are_not_blamed() -> None:
    assert fired(_full_host(2, 3.0)) == []


def test_a_training_thread_loading_from_no_dataloader_is_not_told_num_workers() -> None:
    # The same CPU-bound loading, from a generator (no DataLoader seen): no num_workers to set.
    b = RunBuilder(interval=0.1, cpu_count=2)
    b.steps([0.1] * 100, waits=0.079, wait_cpu=97.0, batch_kind=None)
    (f,) = fired(b.process(1000, "main", 78.0).build())
    assert f.evidence["role"] == "main" and "num_workers" not in f.recommendation
    assert f.recommendation.startswith("With no DataLoader seen, the training thread runs at 97%")
    assert "move loading out of the training thread" in f.recommendation
