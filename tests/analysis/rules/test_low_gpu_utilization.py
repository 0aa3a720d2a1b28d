"""LowGPUUtilization: the p95 utilization of each GPU the job could use, what to look at first, and
silence where NVML gave nothing or the job never used CUDA."""

from __future__ import annotations

import numpy as np
from rule_runs import RunBuilder, rules


def test_low_p95_utilization_is_reported_per_gpu(builder: RunBuilder) -> None:
    builder.steps([0.1] * 100).gpu(35.0, device="0").gpu(90.0, device="1")
    f = rules(builder.build())["LowGPUUtilization"]
    assert f.evidence["gpu0_util_p95"] == 35.0 and "gpu1_util_p95" not in f.evidence


def test_busy_gpu_with_deep_dips_fluctuates(builder: RunBuilder) -> None:
    builder.steps([0.1] * 100).gpu(lambda t: np.where((t * 10).astype(int) % 3 == 0, 0.0, 99.0))
    f = rules(builder.build())["LowGPUUtilization"]
    assert "dips" in f.title and 0.3 <= f.evidence["gpu0_dip_share"] <= 0.37


def test_low_gpu_points_at_the_input_pipeline_when_steps_wait(builder: RunBuilder) -> None:
    builder.steps([0.1] * 100, waits=0.05).gpu(30.0)
    assert "input pipeline" in rules(builder.build())["LowGPUUtilization"].recommendation


def test_an_unmeasured_data_wait_is_not_read_as_little_wait() -> None:
    # A generator feeding gpufeed.step(): no step measured its wait. Read as 0 it said "data
    # wait is small: raise the batch size" and CPUBottleneck blamed kernel launches.
    b = RunBuilder(cpu_count=16).steps([0.1] * 200, waits=np.nan).metric("cpu.util", 20.0)
    found = rules(b.process(1000, "main", 100.0).gpu(35.0, mem_used=10e9).build())
    low = found["LowGPUUtilization"]
    assert low.evidence["data_wait_share"] == "unknown"
    assert (
        "was not measured" in low.recommendation and "data wait is small" not in low.recommendation
    )
    assert "BatchSize" not in found and "CPUBottleneck" not in found
    measured = RunBuilder(cpu_count=16).steps([0.1] * 200).metric("cpu.util", 20.0)
    found = rules(measured.process(1000, "main", 100.0).gpu(35.0, mem_used=10e9).build())
    assert {"BatchSize", "CPUBottleneck"} <= set(found)  # the same run, its wait measured as 0


def test_gpu_rules_are_silent_on_cpu_only_runs() -> None:
    run = RunBuilder().steps([0.05] * 200).build(gpu_unavailable="NVML not found")
    found = rules(run)
    assert not {"LowGPUUtilization", "BatchSize", "MixedPrecision"} & set(found)


def test_gpu_rules_judge_only_the_gpus_the_job_could_use(builder: RunBuilder) -> None:
    builder.steps([0.1] * 100).gpu(35.0, device="0").gpu(20.0, device="1")
    run = builder.build(env={"CUDA_VISIBLE_DEVICES": "1"})
    f = rules(run)["LowGPUUtilization"]
    assert "gpu1_util_p95" in f.evidence and "gpu0_util_p95" not in f.evidence
    hidden = builder.build(env={"CUDA_VISIBLE_DEVICES": ""})
    assert not {"LowGPUUtilization", "BatchSize"} & set(rules(hidden))


def test_a_one_gpu_job_on_an_eight_gpu_node_is_not_judged_by_the_seven_idle_ones(
    builder: RunBuilder,
) -> None:
    # `python train.py` on cuda:0, no CUDA_VISIBLE_DEVICES: the other GPUs never run a kernel
    builder.steps([0.066] * 300, waits=0.001, samples=256).gpu(97.0, mem_used=30e9, device="0")
    for idle in range(1, 8):
        builder.gpu(0.0, mem_used=0.5e9, device=str(idle))
    assert "LowGPUUtilization" not in rules(builder.build(env={}))
    builder.gpu(30.0, mem_used=20e9, device="3")  # a second GPU the job (or another) drives
    f = rules(builder.build(env={}))["LowGPUUtilization"]
    assert "gpu3_util_p95" in f.evidence and "gpu1_util_p95" not in f.evidence


def test_a_cpu_only_job_on_a_gpu_host_gets_no_gpu_advice(builder: RunBuilder) -> None:
    builder.steps([0.05] * 200, samples=16).gpu(0.0, mem_used=1e9)
    assert {"LowGPUUtilization", "BatchSize"} <= set(rules(builder.build()))
    for rank in builder.ranks:
        rank["cuda"] = False  # its training process never initialized CUDA
    assert not {"LowGPUUtilization", "BatchSize"} & set(rules(builder.build()))


def test_a_wait_low_gpu_blames_on_the_input_has_an_input_finding_to_point_at() -> None:
    # Steps wait 15% for data (input-bound for diagnose and tune too) on a half-idle GPU: the
    # rule LowGPUUtilization refers to fires with a worker count, it is not left silent.
    b = RunBuilder(cpu_count=16).steps([0.1] * 200, waits=0.015).gpu(50.0, mem_used=60e9)
    b.process(1000, "main", 100.0)
    for w in range(4):
        b.process(2000 + w, "worker", 60.0)
    found = rules(b.build())
    assert "see DataLoaderBottleneck" in found["LowGPUUtilization"].recommendation
    assert "num_workers=5" in found["DataLoaderBottleneck"].recommendation
