"""Read and write a data set's index as plain JSON (the legacy version-1 lists), for tests that
edit what the index promises."""

from __future__ import annotations

import json
from pathlib import Path

from gpufeed.data.shards import INDEX_NAME, Index


def index_doc(data: bytes) -> dict:
    """An index's bytes (any version) as a version-1 JSON document."""
    return json.loads(Index.from_bytes(data, "test").to_bytes(version=1))


def read_index_doc(d: Path) -> dict:
    """The index of data set `d` as a version-1 JSON document."""
    return index_doc((d / INDEX_NAME).read_bytes())
