"""LoadBalancing: the slow rank, or the one waiting on data, named; its GPU matched on its host."""

from __future__ import annotations

import numpy as np
import pytest
from rule_runs import RunBuilder, healthy, rules


def test_unsynchronized_ranks_with_one_slow(builder: RunBuilder) -> None:
    builder.steps([0.1] * 100, rank=0).steps([0.14] * 100, rank=1)
    f = rules(builder.build())["LoadBalancing"]
    assert f.evidence["slow_rank"] == 1 and f.evidence["step_ratio"] == pytest.approx(1.4)


def test_synchronized_ranks_name_the_one_waiting_on_data(builder: RunBuilder) -> None:
    # DDP: both ranks take 100 ms; rank 1 spends 40 of them waiting for its loader.
    builder.steps([0.1] * 100, waits=0.002, rank=0).steps([0.1] * 100, waits=0.04, rank=1)
    f = rules(builder.build())["LoadBalancing"]
    assert f.evidence["slow_rank"] == 1 and f.evidence["wait_share_gap"] == pytest.approx(0.38)


def test_balanced_ranks_are_quiet(builder: RunBuilder) -> None:
    healthy(builder)
    builder.steps(np.full(200, 0.1), waits=0.002, rank=1)
    assert "LoadBalancing" not in rules(builder.build())


def test_the_busiest_gpu_is_the_rank_whose_local_rank_maps_to_it() -> None:
    # CUDA_VISIBLE_DEVICES=2,3: local rank 1 computes on cuda:1, NVML's GPU 3.
    b = RunBuilder(cpu_count=16)
    for rank in range(2):
        b.steps([0.1] * 200, waits=0.001, rank=rank)
    b.gpu(60.0, device="2").gpu(95.0, device="3")
    f = rules(b.build(env={"CUDA_VISIBLE_DEVICES": "2,3"}))["LoadBalancing"]
    assert f.evidence["slow_rank"] == 1
    assert f.recommendation.startswith("Rank 1's GPU is 95% busy while another is 60%.")


def test_on_several_hosts_the_busiest_gpu_is_matched_on_its_host() -> None:
    from gpufeed.analysis.combine import combine

    parts = []
    for h, host in enumerate(["node0", "node1"]):
        b = RunBuilder(cpu_count=16, host=host)
        for local in range(2):
            b.steps([0.1] * 200, waits=0.001, rank=2 * h + local)
            b.gpu(95.0 if (h, local) == (1, 1) else 60.0, device=str(local))
        run = b.build(hosts=[host])
        run.steps["local_rank"] = run.steps["rank"] % 2
        parts.append(run)
    f = rules(combine(parts))["LoadBalancing"]
    assert f.evidence["slow_rank"] == 3  # node1's GPU 1, not node0's local rank 1
