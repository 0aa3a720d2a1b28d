"""What `--data` names for `diagnose` and `tune`: an image folder, a shard directory, or the
user's own loader as `module:function`; and a small pre-resized sample packed from a folder."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from gpufeed.advise.measure import MeasureError, load_object
from gpufeed.data.index_file import has_index
from gpufeed.data.location import is_remote
from gpufeed.text import count

SAMPLE_IMAGES = 512  # images packed for the pre-resized alternative


@dataclass
class DataSpec:
    """What `--data` named: an image folder, a shard directory, or a `module:function` loader."""

    kind: str  # "folder" | "shards" | "function"
    where: str
    loader: Iterable[Any] | None = None  # the user's own loader (kind "function")


def resolve_data(data: str) -> DataSpec:
    """Classify `--data`; MeasureError naming the path or function when it is unusable. A URL
    (s3://BUCKET/PREFIX) names remote shards, which the Loader reads (and checks) itself."""
    if is_remote(data):
        return DataSpec("shards", data)
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


class Sample(NamedTuple):
    """A packed sample: its shard directory and the sampled images left out of it (path, why)."""

    shards: Path
    skipped: list[tuple[str, str]]

    def left_out(self, shown: int = 3) -> str:
        """One line naming the sampled files that were left out ("" when none were)."""
        if not self.skipped:
            return ""
        n = len(self.skipped)
        rows = "; ".join(f"{p} ({why})" for p, why in self.skipped[:shown])
        more = f"; and {n - shown} more" if n > shown else ""
        return (
            f"{count(n, 'sampled file')} left out: {rows}{more} "
            "(`gpufeed pack` lists every file it leaves out)"
        )


def sample_resize(image_size: int) -> int:
    """The short side a sample is pre-resized to for training at `image_size`: room for the
    random-resized crop."""
    return math.ceil(image_size * 1.15)


def pack_sample(folder: str, dst: Path, image_size: int, n: int = SAMPLE_IMAGES) -> Sample:
    """Pack up to `n` images of an image folder (an even sample), pre-resized for `image_size`;
    sampled images that cannot be decoded are left out and listed, as `gpufeed pack` does."""
    import warnings

    from gpufeed.data.packing import NothingPacked, PackError, list_inputs, pack

    try:
        items, classes, _ = list_inputs(folder)
        step = max(1, len(items) // n)
        lst = dst / "sample.txt"
        dst.mkdir(parents=True, exist_ok=True)
        chosen = items[::step][:n]
        if not chosen:
            raise PackError(f"no images found: expected {folder}/<class>/<image> files")
        # absolute paths: a list file's relative paths are read from the list file's folder
        rows = (f"{os.path.abspath(it.path)}\t{classes[it.label]}\n" for it in chosen)
        lst.write_text("".join(rows))
        as_given = {os.path.abspath(it.path): it.path for it in chosen}
        with warnings.catch_warnings():  # a sample is far below the 1-128 MB shard advice
            warnings.simplefilter("ignore")
            done = pack(lst, dst / "shards", resize=sample_resize(image_size), progress=False)
    except NothingPacked as e:
        eg = "".join(f" (e.g. {as_given.get(p, p)}: {why})" for p, why in e.skipped[:1])
        raise MeasureError(
            f"--data {folder}: none of the {count(len(chosen), 'file')} sampled from it is a "
            f"readable image{eg}; fix or remove them, `gpufeed pack {folder} DST` lists every one"
        ) from None
    except PackError as e:
        raise MeasureError(f"--data {folder}: {e}") from None
    return Sample(dst / "shards", [(as_given.get(p, p), why) for p, why in done.skipped])
