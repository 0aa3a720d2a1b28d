"""Facts about a run's GPUs: which ones the job could use (CUDA_VISIBLE_DEVICES, CUDA flags,
utilization) and their series per device."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

IDLE_GPU_UTIL = 5.0  # NVML utilization % that a GPU no process runs kernels on never exceeds


def visible_gpus(meta: dict[str, Any]) -> list[str] | None:
    """The NVML indices CUDA_VISIBLE_DEVICES lists, in CUDA's order (cuda:i is the i-th), up
    to the first entry that is not a number, as CUDA reads it; None where it is not set or
    names UUIDs (which cannot be mapped)."""
    visible = (meta.get("env") or {}).get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    out: list[str] = []
    for part in visible.split(","):
        part = part.strip()
        if not part.isdigit():
            if not out and part and not part.startswith("-"):
                return None  # GPU-… / MIG-… UUIDs
            break
        out.append(str(int(part)))
    return out


def used_gpus(
    meta: dict[str, Any], visible: list[str] | None, util: pd.DataFrame
) -> set[str] | None:
    """NVML indices of the GPUs the job used; None: all that NVML reported (cannot tell).

    No GPU when no training process initialized CUDA (ranks' "cuda" flag); else those
    `visible` lists; where CUDA_VISIBLE_DEVICES is not set, those that ran kernels in
    the window (`util`: gpu.util rows; a one-GPU job on an 8-GPU node leaves 7 at 0%).
    """
    flags = [r.get("cuda") for r in meta.get("ranks") or [] if r.get("cuda") is not None]
    if flags and not any(flags):
        return set()
    if visible is not None:
        return set(visible)
    worked = {str(d) for d, g in util.groupby("device") if g["value"].max() > IDLE_GPU_UTIL}
    return worked if worked and worked != set(util["device"].astype(str)) else None


def gpu_of(visible: list[str] | None, local_rank: int) -> str | None:
    """The NVML index of the GPU a training process of `local_rank` uses (cuda:local_rank),
    None where CUDA_VISIBLE_DEVICES (`visible`) hides it."""
    if visible is None:
        return str(local_rank)
    return visible[local_rank] if local_rank < len(visible) else None


def per_device(rows: pd.DataFrame) -> dict[str, np.ndarray]:
    """Values of one metric's `rows` per device label ("host:device" when several hosts),
    time-ordered."""
    multi_host = rows["host"].nunique() > 1 if len(rows) else False
    out: dict[str, np.ndarray] = {}
    for (host, device), g in rows.groupby(["host", "device"], sort=True):
        label = f"{host}:{device}" if multi_host else str(device)
        out[label] = g.sort_values("time")["value"].to_numpy(dtype=float)
    return out
