"""Strict JSON for the files gpufeed writes: a value that was not measured (NaN, inf) is written as
null, never as NaN or Infinity, which are not JSON."""

from __future__ import annotations

import json
import math
from typing import Any


def json_safe(value: Any) -> Any:
    """`value` with every float that is not finite (NaN, inf) replaced by None, in nested dicts and
    lists: strict JSON has no NaN, and `null` is what other tools read as "not measured"."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def strict_json(value: Any, **kwargs: Any) -> str:
    """`json.dumps` that never writes NaN or Infinity (invalid JSON): non-finite floats become null."""
    try:
        return json.dumps(value, allow_nan=False, **kwargs)
    except ValueError:  # a NaN somewhere: clean the whole tree (only then, it costs a walk)
        return json.dumps(json_safe(value), allow_nan=False, **kwargs)
