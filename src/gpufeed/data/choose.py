"""CPU workers or the GPU for decode and augmentation: the one place that choice is made, by the
Loader (`preprocess="auto"`) and by `gpufeed tune`, each measuring trials its own way."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from gpufeed.data.rate import measure_loader

PREPROCESS_MODES = ("cpu", "gpu", "auto")


def choose_preprocess(
    requested: str, device: Any, cluster: str | None, rate: Callable[[str], float]
) -> tuple[str, str]:
    """(mode, reason): the mode asked for, else ("auto") CPU where the GPU cannot preprocess (no
    CUDA device, or a Ray cluster doing the work), else whichever of "cpu" and "gpu" `rate(mode)`
    measures faster in images/s: the loader alone, which does not count the GPU time a GPU
    decoder takes from the model (`gpufeed tune --model` measures that end to end)."""
    import torch

    if requested != "auto":
        return requested, "requested"
    if cluster is not None:
        return "cpu", f"on the Ray cluster {cluster}"
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return "cpu", "no CUDA device: preprocessing on CPU workers"
    rates = {mode: rate(mode) for mode in ("cpu", "gpu")}
    best = max(rates, key=rates.__getitem__)
    return best, "measured images/s " + ", ".join(f"{m}={r:.0f}" for m, r in rates.items())


def trial_rate(loader: Any) -> float:
    """Images/s of a short trial of a Loader (a few batches after its warm-up); closes it."""
    try:
        return measure_loader(loader, seconds=math.inf, max_batches=6, warmup=3).images_per_s
    finally:
        loader.close()
