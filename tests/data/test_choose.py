"""CPU workers or the GPU: what is asked for is kept; "auto" stays on CPU where the GPU cannot
preprocess and otherwise takes the mode its trials measure faster."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gpufeed.data.choose import choose_preprocess, trial_rate
from gpufeed.data.loader import Loader

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def untried(mode: str) -> float:
    raise AssertionError(f"no trial should run, yet {mode} was measured")


@pytest.mark.parametrize("mode", ["cpu", "gpu"])
def test_a_requested_mode_is_kept_without_a_trial(mode: str):
    assert choose_preprocess(mode, "cpu", None, untried) == (mode, "requested")


def test_auto_preprocesses_on_cpu_where_the_gpu_cannot():
    assert choose_preprocess("auto", "cpu", None, untried) == (
        "cpu",
        "no CUDA device: preprocessing on CPU workers",
    )
    mode, reason = choose_preprocess("auto", "cuda", "10.0.0.1:6379", untried)
    assert (mode, reason) == ("cpu", "on the Ray cluster 10.0.0.1:6379")


@cuda
@pytest.mark.parametrize(("cpu", "gpu", "chosen"), [(100.0, 300.0, "gpu"), (500.0, 200.0, "cpu")])
def test_auto_takes_the_mode_measured_faster(cpu: float, gpu: float, chosen: str):
    measured: list[str] = []

    def rate(mode: str) -> float:
        measured.append(mode)
        return {"cpu": cpu, "gpu": gpu}[mode]

    mode, reason = choose_preprocess("auto", "cuda", None, rate)
    assert mode == chosen and measured == ["cpu", "gpu"]
    assert reason == f"measured images/s cpu={cpu:.0f}, gpu={gpu:.0f}"


def test_a_trial_measures_a_real_loader_and_closes_it(shards: Path):
    loader = Loader(shards, 4, num_workers=1, device="cpu")
    assert trial_rate(loader) > 0
    assert loader._pool is None  # its worker processes are stopped


def test_the_trial_of_a_mode_keeps_the_users_limits(shards: Path):
    # a raised max_device_bytes held for the loader but not for its GPU trial, which then
    # failed on the 8 GiB default the user never set
    from gpufeed.data.augment import Augment

    loader = Loader(
        shards, 512, num_workers=0, device="cpu", augment=Augment(size=(512, 512)),
        max_device_bytes=64 << 30, strict=True, worker_nice=0,
    )  # fmt: skip
    assert loader._trial_rate("gpu") > 0
