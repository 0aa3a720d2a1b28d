"""What a training batch holds, as the hooks see it: its leading dimension and its kind.

A batch is the user's object (nested lists, tuples and dicts of tensors, or anything else): these
look for the first tensor-like inside and never raise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def batch_size(batch: Any) -> int | None:
    """Leading dimension of the first tensor-like (has `.shape`) in a batch of nested lists/dicts.

    None where it cannot tell: a batch is the user's object, and whatever its `shape` is (a method, a
    number, a property that raises) or its container does, this never raises.
    """
    try:
        shape = _first_shape(batch)
        return int(shape[0]) if shape is not None and len(shape) else None
    except Exception:
        return None


def batch_kind(batch: Any) -> str | None:
    """ "image" when a batch's first tensor-like is N×C×H×W (or N×H×W×C), else "other"; None where
    it has no tensor. Rules fit their advice to it (no JPEG advice for tokens or features)."""
    try:
        shape = _first_shape(batch)
        return None if shape is None else "image" if len(shape) == 4 else "other"
    except Exception:
        return None


def _first_shape(batch: Any, depth: int = 0) -> Any:
    """`.shape` of the first tensor-like in nested lists, tuples and dicts (4 levels); None if none."""
    shape = getattr(batch, "shape", None)
    if shape is not None or depth >= 4:
        return shape
    if isinstance(batch, (list, tuple)) and batch:
        return _first_shape(batch[0], depth + 1)
    if isinstance(batch, Mapping) and batch:
        return _first_shape(next(iter(batch.values())), depth + 1)
    return None
