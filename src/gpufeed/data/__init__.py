"""FEED: pack images into shards and load them fast (local or S3, CPU or GPU preprocessing).

Shards: `pack` (packing), index existing WebDataset tars (indexer), format (shards), local/S3
reads (source), the dataset (dataset), decode, augment. The Loader (loader) is a pipeline: plan
(which samples, which worker), workers/produce/batch (read, decode, transform into host slots),
slots (the shared host buffers), feeder and device (the device stage), budget (host memory), spec
(one BatchSpec shared by every stage), remote (Ray), worker_errors (a worker's exception, raised
in the training loop); sample_extras and members (`extras=`: keys and members beside the images).
Measuring a loader: rate; CPU or GPU preprocessing, chosen once: choose. Tuned settings read
back: settings (`load_settings`).

The public names are imported on first use, so `import gpufeed.data` costs nothing; none of them
shares its name with a submodule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpufeed.data.augment import Augment
    from gpufeed.data.dataset import ShardDataset
    from gpufeed.data.loader import Loader
    from gpufeed.data.packing import pack
    from gpufeed.data.settings import load_settings

__all__ = ["Augment", "Loader", "ShardDataset", "load_settings", "pack"]
_WHERE = {
    "Augment": "gpufeed.data.augment",
    "ShardDataset": "gpufeed.data.dataset",
    "Loader": "gpufeed.data.loader",
    "load_settings": "gpufeed.data.settings",
    "pack": "gpufeed.data.packing",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'gpufeed.data' has no attribute {name!r}")
