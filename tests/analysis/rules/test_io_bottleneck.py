"""IOBottleneck: iowait or a read-rate plateau, only while steps wait on data."""

from __future__ import annotations

import numpy as np
from rule_runs import RunBuilder

from gpufeed.analysis.rules import run_rules


def fired(run, **overrides):
    return [f for f in run_rules(run, **overrides) if f.rule == "IOBottleneck"]


def test_high_iowait_while_waiting(builder: RunBuilder) -> None:
    builder.steps([0.1] * 100, waits=0.05).metric("cpu.iowait", 35.0)
    (f,) = fired(builder.build())
    assert f.evidence["iowait_mean_pct"] == 35.0 and "faster local storage" in f.recommendation


def test_iowait_counts_in_cores_so_one_blocked_loader_is_seen_on_many_cores() -> None:
    # One loader blocked on the disk 60% of the time idles 0.6 of a core in iowait: a mean of
    # 30% over 2 cores but 3.75% over 16, below any fixed percentage that suits 2 cores.
    for cores in (2, 16):
        b = RunBuilder(cpu_count=cores).steps([0.2] * 100, waits=0.12)
        (f,) = fired(b.metric("cpu.iowait", 60.0 / cores).build())
        assert f.evidence["iowait_cores"] == 0.6, cores
        assert f"(0.6 of {cores} cores idle, waiting on reads)" in f.title
    quiet = RunBuilder(cpu_count=16).steps([0.2] * 100, waits=0.12).metric("cpu.iowait", 0.5)
    assert not fired(quiet.build())  # 0.08 of a core: noise
    # a pod limited to 4 CPUs on a 64-core node: the sampler averaged over the 64 cores
    pod = RunBuilder(cpu_count=4).steps([0.2] * 100, waits=0.12).metric("cpu.iowait", 60.0 / 64)
    for core in range(64):
        pod.metric("cpu.core", 10.0, str(core))
    (f,) = fired(pod.build())
    assert f.evidence["iowait_cores"] == 0.6 and "(0.6 of 64 cores idle" in f.title
    # the parameter's older form, a percentage, still works
    assert not fired(pod.build(), IOBottleneck={"iowait": 10.0})
    assert fired(pod.build(), IOBottleneck={"iowait": 0.5})


def test_disk_reads_at_a_plateau(builder: RunBuilder) -> None:
    rng = np.random.default_rng(1)
    builder.steps([0.1] * 100, waits=0.05)
    builder.metric("disk.read", lambda t: 250e6 * (1 + 0.02 * rng.standard_normal(len(t))))
    (f,) = fired(builder.build())
    assert 240 <= f.evidence["disk_read_p50_mb_s"] <= 260


def test_network_plateau_suggests_streaming_fixes(builder: RunBuilder) -> None:
    builder.steps([0.1] * 100, waits=0.05).metric("net.rx", 110e6)
    (f,) = fired(builder.build())
    assert "net_rx_p50_mb_s" in f.evidence and "stream larger shards" in f.recommendation


def test_bursty_reads_are_not_a_plateau(builder: RunBuilder) -> None:
    builder.steps([0.1] * 100, waits=0.05)
    builder.metric("disk.read", lambda t: np.where((t * 10).astype(int) % 5 == 0, 400e6, 1e6))
    assert fired(builder.build()) == []


def test_storage_busy_but_no_data_wait_is_fine(builder: RunBuilder) -> None:
    builder.steps([0.1] * 100, waits=0.001).metric("cpu.iowait", 40.0).metric("disk.read", 300e6)
    assert fired(builder.build()) == []


def _sixteen_cores(worker_cpu: float) -> RunBuilder:
    """One H100 host, 16 cores, 15 loader workers at `worker_cpu` % each; steps wait 27%."""
    rng = np.random.default_rng(0)
    b = RunBuilder(interval=0.5, cpu_count=16)
    b.steps(0.103 * (1 + 0.02 * rng.standard_normal(600)), waits=0.028, samples=256)
    b.ranks[0].update(loader_workers=15, cuda=True)
    busy = min(97.0, 10 + 15 * worker_cpu / 16)
    b.metric("cpu.util", busy)
    for core in range(16):
        b.metric("cpu.core", busy, str(core))
    b.process(1000, "main", 100.0, 6e9)
    for k in range(15):
        b.process(2000 + k, "worker", worker_cpu, 1e9)
    return b.gpu(lambda t: 60 + 5 * rng.standard_normal(len(t)), mem_used=30e9)


def test_cpu_bound_workers_read_at_a_steady_rate_without_storage_being_blamed() -> None:
    # 15 workers decoding flat out read what they decode, steadily: a "plateau" of their own
    # making, and a trace of iowait; the CPU is the limit (CPUBottleneck says so), not the disk
    for metric, value in (("disk.read", 160e6), ("cpu.iowait", 2.0)):  # 2%: 0.3 of 16 cores
        rules = {f.rule for f in run_rules(_sixteen_cores(95.0).metric(metric, value).build())}
        assert "CPUBottleneck" in rules and "IOBottleneck" not in rules, metric
    # the same reads from workers that idle 70% of their time do blame the disk
    b = _sixteen_cores(worker_cpu=30.0).metric("disk.read", 160e6)
    (f,) = fired(b.build())
    assert f.evidence["disk_read_p50_mb_s"] == 160.0


def test_traffic_sent_as_much_as_received_is_a_collective_not_data(builder: RunBuilder) -> None:
    # a gradient all-reduce between hosts holds receive at a steady rate, and sends as much
    builder.steps([0.1] * 100, waits=0.05).metric("net.rx", 900e6).metric("net.tx", 880e6)
    assert fired(builder.build()) == []
    streaming = RunBuilder().steps([0.1] * 100, waits=0.05)
    (f,) = fired(streaming.metric("net.rx", 900e6).metric("net.tx", 20e6).build())
    assert f.evidence["net_rx_p50_mb_s"] == 900.0
