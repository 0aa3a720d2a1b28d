"""FEED: pack images into shards and load them fast (local or S3, CPU or GPU preprocessing).

`ShardDataset` and `Loader` (which need torch) are imported on first use. `pack` is imported now:
the function shares its name with the submodule `gpufeed.data.pack`, and binding it eagerly keeps a
later submodule import from rebinding `gpufeed.data.pack` to the module (numpy only, no torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpufeed.data.dataset import ShardDataset
    from gpufeed.data.loader import Loader
    from gpufeed.data.settings import load_settings

from gpufeed.data.pack import pack

__all__ = ["Loader", "ShardDataset", "load_settings", "pack"]
_WHERE = {
    "ShardDataset": "gpufeed.data.dataset",
    "Loader": "gpufeed.data.loader",
    "load_settings": "gpufeed.data.settings",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'gpufeed.data' has no attribute {name!r}")
