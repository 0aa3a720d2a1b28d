"""FEED: pack images into shards and load them fast (local or S3, CPU or GPU preprocessing).

Shards: pack, index existing WebDataset tars (indexer), format (shards), local/S3 reads (source),
the dataset (dataset), decode, augment. The Loader (loader) is a pipeline: plan (which samples, which
worker), workers/produce/batch (read, decode, transform into host slots), feeder and device (the
device stage), budget (host memory), spec (one BatchSpec shared by every stage), remote (Ray).
Measuring a loader: rate. Tuned settings read back: settings (`load_settings`).

`ShardDataset`, `Loader` and `load_settings` are imported on first use. `pack` is imported now:
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
