"""What `--data` names for `diagnose` and `tune`: an image folder, a shard directory, or the
user's own loader as `module:function`; and a small pre-resized sample packed from a folder."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufeed.advise.measure import MeasureError, load_object
from gpufeed.data.shards import has_index

SAMPLE_IMAGES = 512  # images packed for the pre-resized alternative


@dataclass
class DataSpec:
    """What `--data` named: an image folder, a shard directory, or a `module:function` loader."""

    kind: str  # "folder" | "shards" | "function"
    where: str
    loader: Iterable[Any] | None = None  # the user's own loader (kind "function")


def resolve_data(data: str) -> DataSpec:
    """Classify `--data`; MeasureError naming the path or function when it is unusable."""
    path = Path(data)
    if path.is_dir():
        return DataSpec("shards" if has_index(path) else "folder", str(path))
    if path.exists():
        raise MeasureError(
            f"--data {data}: is a file; give an image folder (ROOT/<class>/<image>), a directory "
            "of shards made by `gpufeed pack`, or module:function returning your DataLoader"
        )
    if ":" in data:
        loader = load_object(data, "--data")
        if not hasattr(loader, "__iter__"):
            raise MeasureError(
                f"--data {data} returned a {type(loader).__name__}, which cannot be iterated: "
                "return your DataLoader (or any iterable of (images, labels) batches)"
            )
        return DataSpec("function", data, loader)
    raise MeasureError(
        f"--data {data}: no such directory; give an image folder, a shard directory "
        "or module:function returning your DataLoader"
    )


def pack_sample(folder: str, dst: Path, image_size: int, n: int = SAMPLE_IMAGES) -> Path:
    """Pack up to `n` images of an image folder (an even sample), pre-resized for `image_size`."""
    import warnings

    from gpufeed.data.packing import PackError, list_inputs, pack

    try:
        items, classes, _ = list_inputs(folder)
        step = max(1, len(items) // n)
        lst = dst / "sample.txt"
        dst.mkdir(parents=True, exist_ok=True)
        # absolute paths: a list file's relative paths are read from the list file's folder
        rows = (f"{os.path.abspath(it.path)}\t{classes[it.label]}\n" for it in items[::step][:n])
        lst.write_text("".join(rows))
        with warnings.catch_warnings():  # a sample is far below the 1-128 MB shard advice
            warnings.simplefilter("ignore")
            pack(lst, dst / "shards", resize=math.ceil(image_size * 1.15), progress=False)
    except PackError as e:
        raise MeasureError(f"--data {folder}: {e}") from None
    return dst / "shards"
