"""GPUMemoryIncrease: GPU memory or a training process's host memory growing steadily, projected to
when it runs out (with every process growing on the host), named with its host."""

from __future__ import annotations

import numpy as np
import pytest
from rule_runs import RunBuilder, rules

from gpufeed.analysis.rules import run_rules


def test_gpu_memory_growing_steadily_projects_when_it_runs_out(builder: RunBuilder) -> None:
    builder.steps([0.1] * 600).gpu(90.0, mem_used=lambda t: 10e9 + 0.2e9 * t, total=80e9)
    f = rules(builder.build())["GPUMemoryIncrease"]
    assert f.evidence["growth_mb_per_min"] == pytest.approx(12000, rel=0.01)
    assert f.evidence["minutes_until_full"] < 10 and f.severity == "critical"


def test_a_growing_gpu_on_one_of_several_hosts_is_named_with_its_host() -> None:
    # both hosts have a GPU 0: "GPU 0 memory" alone does not say which one runs out
    from gpufeed.analysis.combine import combine

    parts = []
    for rank, host in enumerate(("node-a", "node-b")):
        grows = lambda t, r=rank: 10e9 + r * 0.2e9 * t  # noqa: E731 - only node-b's grows
        b = RunBuilder(host=host).steps([0.1] * 600, rank=rank).gpu(90.0, mem_used=grows)
        parts.append(b.build())
    f = rules(combine(parts))["GPUMemoryIncrease"]
    assert f.evidence["memory"] == "GPU 0 memory on node-b" and "on node-b" in f.title


def test_host_memory_of_the_training_process_on_cpu_runs(builder: RunBuilder) -> None:
    builder.steps([0.1] * 300).process(1000, "main", 100.0, rss=lambda t: 4e8 + 2e7 * t)
    f = rules(builder.build())["GPUMemoryIncrease"]
    assert "training process 1000" in f.evidence["memory"] and f.evidence["growth_mb"] > 400


def test_memory_that_is_merely_noisy_or_small_is_fine(builder: RunBuilder) -> None:
    rng = np.random.default_rng(0)
    builder.steps([0.1] * 300)
    builder.process(1000, "main", 100.0, rss=lambda t: 2e9 + 2e8 * rng.random(len(t)))
    builder.process(1001, "main", 100.0, rss=lambda t: 2e9 + 1e6 * t)  # 30 MB: too little
    assert "GPUMemoryIncrease" not in rules(builder.build())


def test_host_memory_is_watched_on_gpu_runs_too_but_not_the_loader_workers() -> None:
    # GPU memory flat; the training process's RSS grows 3 GB/min on a 128 GiB host. Each of 15
    # loader workers' RSS grows 0.5 GB/min, as it does while they read a memory-mapped data set
    # (page cache, not a leak): not a finding.
    b = RunBuilder(cpu_count=16, interval=0.5).steps([0.1] * 1200, waits=0.002)
    b.metric("mem.total", 128 * 2**30).gpu(95.0, mem_used=40e9)
    b.process(1000, "main", 100.0, rss=lambda t: 4e9 + 3e9 * t / 60)
    for w in range(15):
        b.process(2000 + w, "worker", 50.0, rss=lambda t: 1e9 + 0.5e9 * t / 60)
    found = [f for f in run_rules(b.build()) if f.rule == "GPUMemoryIncrease"]
    assert [f.evidence["memory"] for f in found] == ["Host memory of training process 1000"]
    (main,) = found
    assert main.evidence["growth_mb_per_min"] == pytest.approx(3000, rel=0.01)
    assert main.evidence["total_mb"] == pytest.approx(128 * 2**30 / 1e6, rel=1e-3)
    assert ".detach()" in main.recommendation


def test_ranks_growing_on_one_host_fill_it_together() -> None:
    # 4 DDP ranks on a 64 GB host, each process at 10 GB and growing 10 MB/s: the host is full in
    # about 8 minutes (each rank alone, against the whole host, projected 88).
    b = RunBuilder(cpu_count=32, interval=1.0)
    for r in range(4):
        b.steps([0.1] * 1200, waits=0.0, rank=r)
        b.gpu(95.0, 40e9, device=str(r))
    end = 10e9 + 10e6 * 121
    b.metric("mem.total", 64e9).metric("mem.used", lambda t: 4 * (10e9 + 10e6 * t))
    for r in range(4):
        b.process(1000 + r, "main", 100.0, rss=lambda t: 10e9 + 10e6 * t)
    found = [f for f in run_rules(b.build()) if f.rule == "GPUMemoryIncrease"]
    assert len(found) == 4
    for f in found:
        assert f.severity == "critical"
        assert f.evidence["minutes_until_full"] == pytest.approx((64e9 - 4 * end) / 40e6 / 60, 0.05)
        assert f.evidence["processes_growing_on_host"] == 4
        assert "with the 4 training processes growing on its host" in f.recommendation


def test_without_the_hosts_used_memory_the_processes_own_rss_is_taken() -> None:
    b = RunBuilder(cpu_count=8, interval=1.0).steps([0.1] * 1200)
    b.metric("mem.total", 64e9)
    for pid in (1000, 1001):
        b.process(pid, "main", 100.0, rss=lambda t: 10e9 + 10e6 * t)
    (f, _) = [f for f in run_rules(b.build()) if f.rule == "GPUMemoryIncrease"]
    end = 10e9 + 10e6 * 121
    assert f.evidence["minutes_until_full"] == pytest.approx((64e9 - 2 * end) / 20e6 / 60, 0.05)
