"""FEED: pack images into shards and load them fast (local or S3, CPU or GPU preprocessing).

`pack`, `ShardDataset` and `Loader` are imported on first use so `import gpufeed.data` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpufeed.data.dataset import ShardDataset
    from gpufeed.data.loader import Loader
    from gpufeed.data.pack import pack

__all__ = ["Loader", "ShardDataset", "pack"]
_WHERE = {
    "pack": "gpufeed.data.pack",
    "ShardDataset": "gpufeed.data.dataset",
    "Loader": "gpufeed.data.loader",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'gpufeed.data' has no attribute {name!r}")
