"""LowGPUUtilization, BatchSize and MixedPrecision: GPU-only rules, silent where NVML gave nothing."""

from __future__ import annotations

import numpy as np
from rule_runs import RunBuilder, healthy

from gpufeed.analysis.rules import run_rules


def rules(run, **overrides):
    return {f.rule: f for f in run_rules(run, **overrides)}


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


def test_small_batch_with_idle_gpu_and_free_memory(builder: RunBuilder) -> None:
    builder.steps([0.05] * 200, samples=16).gpu(25.0, mem_used=6e9, total=80e9)
    f = rules(builder.build())["BatchSize"]
    # 6 of 80 GB used: 0.8 / 0.075 = 10.7 -> 8x larger batch.
    assert "batch size 128 (now 16)" in f.recommendation and "learning rate" in f.recommendation


def test_batch_size_stays_quiet_when_input_bound_or_memory_full(builder: RunBuilder) -> None:
    b1 = RunBuilder().steps([0.05] * 200, waits=0.02).gpu(25.0, mem_used=6e9)
    b2 = RunBuilder().steps([0.05] * 200).gpu(25.0, mem_used=70e9)
    assert "BatchSize" not in rules(b1.build()) and "BatchSize" not in rules(b2.build())


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


def test_mixed_precision_needs_fp32_tensor_cores_and_compute_bound_steps(
    builder: RunBuilder,
) -> None:
    healthy(builder).gpu(97.0, mem_used=60e9)
    assert "MixedPrecision" not in rules(builder.build())  # precision unknown: silent
    f = rules(builder.build(precision="fp32"))["MixedPrecision"]
    assert f.evidence["gpu"].startswith("NVIDIA H100") and "autocast" in f.recommendation
    assert "MixedPrecision" not in rules(builder.build(precision="bf16"))
    pascal = [{"index": 0, "name": "Tesla P100-PCIE-16GB", "memory_total": 16e9}]
    assert "MixedPrecision" not in rules(builder.build(precision="fp32", gpus=pascal))


def test_mixed_precision_reads_tensor_cores_from_the_compute_capability(
    builder: RunBuilder,
) -> None:
    healthy(builder).gpu(97.0, mem_used=60e9)
    unnamed = [{"index": 0, "name": "NVIDIA Graphics Device", "compute_capability": "9.0"}]
    f = rules(builder.build(precision="fp32", gpus=unnamed))["MixedPrecision"]
    assert f.evidence["gpu"] == "NVIDIA Graphics Device" and f.evidence["precision"] == "fp32"
    for precision in ("bf16", "fp16", "mixed"):
        assert "MixedPrecision" not in rules(builder.build(precision=precision, gpus=unnamed))
    pascal = [{"index": 0, "name": "Quadro P6000", "compute_capability": "6.1"}]
    assert "MixedPrecision" not in rules(builder.build(precision="fp32", gpus=pascal))


def test_mixed_precision_stays_quiet_when_fp32_steps_wait_for_data(builder: RunBuilder) -> None:
    builder.steps([0.1] * 200, waits=0.04).gpu(97.0, mem_used=60e9)
    gpus = [{"index": 0, "name": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0"}]
    assert "MixedPrecision" not in rules(builder.build(precision="fp32", gpus=gpus))


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


def test_the_rules_call_steps_input_bound_where_diagnose_and_tune_do() -> None:
    from gpufeed.advise import diagnose, tune
    from gpufeed.analysis.rules.dataloader_bottleneck import DataLoaderBottleneck
    from gpufeed.analysis.rules.params import INPUT_BOUND

    assert INPUT_BOUND == diagnose.WAITING == tune.WAITING
    assert DataLoaderBottleneck.params["threshold"].default == INPUT_BOUND
