"""Deprecated home of `load_settings`, kept because earlier READMEs named it; use `gpufeed.data`."""

from __future__ import annotations

import os
import warnings
from typing import Any

__all__ = ["load_settings"]


def load_settings(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Deprecated: `gpufeed.data.load_settings` (same arguments, same result)."""
    from gpufeed.data.settings import load_settings as _load

    warnings.warn(
        "gpufeed.bench.tune.load_settings moved: use gpufeed.data.load_settings",
        DeprecationWarning,
        stacklevel=2,
    )
    return _load(path)
