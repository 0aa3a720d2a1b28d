"""The machine an experiment ran on (CPU model and cores, GPUs, library versions), recorded with its results.

Builds on the profiler's run metadata (`machine_meta`) and adds what experiments also need:
usable cores, GPU models and the imaging libraries' versions.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

from gpufeed.cores import memory_limit, usable_cores
from gpufeed.profiler.session import machine_meta

__all__ = ["describe", "hardware"]

_EXTRA_LIBRARIES = (
    "simplejpeg",
    "pillow",
    "torchvision",
    "nvidia-dali-cuda120",
    "nvidia-dali-cuda130",
    "nvidia-nvimgcodec-cu12",
    "nvidia-nvimgcodec-cu13",
)


def hardware() -> dict[str, Any]:
    """CPU, memory, GPUs and library versions as a JSON-ready dict; `memory_limit` is the
    container's (cgroup) memory limit where one is set below the machine's memory."""
    import psutil
    import torch

    info: dict[str, Any] = machine_meta()
    info["cpu_cores"] = usable_cores()
    info["memory_total"] = psutil.virtual_memory().total
    limit = memory_limit()
    if limit is not None and limit < info["memory_total"]:
        info["memory_limit"] = limit
    info["gpus"] = []
    info["versions"]["torch"] = torch.__version__  # with its build: 2.11.0+cu130, not 2.11.0
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            info["gpus"].append({"index": i, "name": p.name, "memory_total": p.total_memory})
        info["versions"]["cuda"] = torch.version.cuda
        info["versions"]["cudnn"] = str(torch.backends.cudnn.version())
    else:
        info["gpu_unavailable"] = "torch.cuda.is_available() is False"
    for lib in _EXTRA_LIBRARIES:
        try:
            info["versions"][lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            continue
    return info


def describe(info: dict[str, Any]) -> str:
    """One line for a results table: cores, CPU, GPU(s) and the torch version."""
    gpus = ", ".join(g["name"] for g in info.get("gpus", [])) or "no GPU"
    torch_version = info.get("versions", {}).get("torch", "?")
    return f"{info['cpu_cores']}-core {info['cpu_model']}; {gpus}; torch {torch_version}"
