"""The hardware recorded with every experiment's results."""

from __future__ import annotations

import os

import torch

from gpufeed.cores import usable_cores
from gpufeed.extras import installed
from gpufeed.hardware import describe, hardware


def test_records_cpu_cores_memory_gpus_and_versions() -> None:
    info = hardware()
    assert info["cpu_cores"] == usable_cores() == len(os.sched_getaffinity(0))
    assert info["memory_total"] > 0 and info["cpu_model"]
    assert info["versions"]["torch"] == torch.__version__
    if installed("nvimgcodec"):  # a decoder the Loader can use: its version is recorded
        assert any(k.startswith("nvidia-nvimgcodec-") for k in info["versions"])
    assert len(info["gpus"]) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    if not torch.cuda.is_available():
        assert "gpu_unavailable" in info


def test_records_the_containers_memory_limit_below_the_machines_memory(monkeypatch) -> None:
    import gpufeed.hardware as hw

    monkeypatch.setattr(hw, "memory_limit", lambda: 1 << 30)
    assert hardware()["memory_limit"] == 1 << 30
    monkeypatch.setattr(hw, "memory_limit", lambda: None)
    assert "memory_limit" not in hardware()
    monkeypatch.setattr(
        hw, "memory_limit", lambda: 1 << 62
    )  # "max" is no limit below the machine's
    assert "memory_limit" not in hardware()


def test_describe_names_cores_cpu_gpu_and_torch() -> None:
    info = {
        "cpu_cores": 2,
        "cpu_model": "Xeon",
        "gpus": [{"name": "H100"}],
        "versions": {"torch": "2.13"},
    }
    assert describe(info) == "2-core Xeon; H100; torch 2.13"
    assert "no GPU" in describe({**info, "gpus": []})
