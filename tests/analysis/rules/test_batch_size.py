"""BatchSize: a larger batch for an idle GPU with free memory, quiet when input-bound or memory-full."""

from __future__ import annotations

from rule_runs import RunBuilder, rules


def test_small_batch_with_idle_gpu_and_free_memory(builder: RunBuilder) -> None:
    builder.steps([0.05] * 200, samples=16).gpu(25.0, mem_used=6e9, total=80e9)
    f = rules(builder.build())["BatchSize"]
    # 6 of 80 GB used: 0.8 / 0.075 = 10.7 -> 8x larger batch.
    assert "batch size 128 (now 16)" in f.recommendation and "learning rate" in f.recommendation


def test_batch_size_stays_quiet_when_input_bound_or_memory_full(builder: RunBuilder) -> None:
    b1 = RunBuilder().steps([0.05] * 200, waits=0.02).gpu(25.0, mem_used=6e9)
    b2 = RunBuilder().steps([0.05] * 200).gpu(25.0, mem_used=70e9)
    assert "BatchSize" not in rules(b1.build()) and "BatchSize" not in rules(b2.build())
