"""MixedPrecision: fp32 steps on a GPU with tensor cores, compute-bound, and only then."""

from __future__ import annotations

from rule_runs import RunBuilder, healthy, rules


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
