"""What precision a training process computes in: torch dtypes as meta "precision" names them,
an optimizer's parameter dtype, and whether autocast is on (read by the step recorder)."""

from __future__ import annotations

import sys
from typing import Any

# Short names of torch dtypes, as meta "precision" spells them.
_DTYPE_NAMES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64"}


def dtype_name(dtype: Any) -> str:
    """A torch dtype as meta "precision" names it: "bf16", "fp16", "fp32", "fp64", else its own name."""
    name = str(dtype).removeprefix("torch.")
    return _DTYPE_NAMES.get(name, name)


def param_precision(optimizer: Any) -> str | None:
    """The dtype holding most of an optimizer's floating-point parameter elements; None if it has none."""
    elements: dict[Any, int] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.is_floating_point():
                elements[p.dtype] = elements.get(p.dtype, 0) + p.numel()
    return dtype_name(max(elements, key=elements.__getitem__)) if elements else None


def autocast_active(device_type: str) -> bool:
    """Whether autocast is on for `device_type` now (False where torch cannot tell)."""
    torch = sys.modules.get("torch")
    try:
        return bool(torch.is_autocast_enabled(device_type))  # type: ignore[union-attr]
    except Exception:
        return False
