"""FEED: pack images into shards and load them fast (local or S3, CPU or GPU preprocessing).

The public names are here: `pack`, `index_shards` (index WebDataset tars you have), `has_index`,
`ShardDataset`, `Augment`, `Loader`, `load_settings`, and the errors a training loop may catch
(`ShardError`, `CorruptSampleError`, `LoaderWorkerError`, `RankMismatch`, `MissingMember`).
Everything else is internal; where each module lives and why: docs/architecture.md ("The feed").

The public names are imported on first use, so `import gpufeed.data` costs nothing; none of them
shares its name with a submodule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpufeed.data.augment import Augment
    from gpufeed.data.batch import CorruptSampleError
    from gpufeed.data.dataset import ShardDataset
    from gpufeed.data.index_file import has_index
    from gpufeed.data.indexer import index_shards
    from gpufeed.data.loader import Loader
    from gpufeed.data.packing import pack
    from gpufeed.data.rank_check import RankMismatch
    from gpufeed.data.sample_extras import MissingMember
    from gpufeed.data.settings import load_settings
    from gpufeed.data.tar_scan import ShardError
    from gpufeed.data.worker_errors import LoaderWorkerError

__all__ = [
    "Augment",
    "CorruptSampleError",
    "Loader",
    "LoaderWorkerError",
    "MissingMember",
    "RankMismatch",
    "ShardDataset",
    "ShardError",
    "has_index",
    "index_shards",
    "load_settings",
    "pack",
]
_WHERE = {
    "Augment": "gpufeed.data.augment",
    "ShardDataset": "gpufeed.data.dataset",
    "Loader": "gpufeed.data.loader",
    "load_settings": "gpufeed.data.settings",
    "pack": "gpufeed.data.packing",
    "index_shards": "gpufeed.data.indexer",
    "has_index": "gpufeed.data.index_file",
    "ShardError": "gpufeed.data.tar_scan",
    "CorruptSampleError": "gpufeed.data.batch",
    "LoaderWorkerError": "gpufeed.data.worker_errors",
    "RankMismatch": "gpufeed.data.rank_check",
    "MissingMember": "gpufeed.data.sample_extras",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'gpufeed.data' has no attribute {name!r}")
