"""Read and write a data set's index as plain JSON (the legacy version-1 lists), for tests that
edit what the index promises."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from gpufeed.data.shards import INDEX_NAME, LEGACY_INDEX_NAME, Index


def index_doc(data: bytes) -> dict:
    """An index's bytes (any version) as a version-1 JSON document."""
    return json.loads(Index.from_bytes(data, "test").to_bytes(version=1))


def read_index_doc(d: Path) -> dict:
    """The index of data set `d` as a version-1 JSON document."""
    return index_doc((d / INDEX_NAME).read_bytes())


def legacy_copy(src: Path, dst: Path) -> Path:
    """A copy of data set `src` at `dst` whose index is a version-1 one without image offsets,
    sizes or extensions (as an older gpufeed wrote it): samples are read member by member."""
    shutil.copytree(src, dst)
    doc = read_index_doc(dst)
    for shard in doc["shards"]:
        for column in ("image_offsets", "image_sizes", "image_exts"):
            shard.pop(column, None)
    (dst / LEGACY_INDEX_NAME).write_text(json.dumps(doc))
    (dst / INDEX_NAME).unlink()
    return dst
