"""The Loader's options checked where they meet the data: `augment` and `dtype`, and `data`
opened as the `ShardDataset` the Loader reads (with its own options checked).

Apart from `loader` so that the Loader only wires the stages.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from gpufeed.cores import cores_per_rank
from gpufeed.data.augment import Augment
from gpufeed.data.dataset import ShardDataset
from gpufeed.data.options import known
from gpufeed.errors import OptionError

# What the loop may receive: floats normalized, or uint8 pixels (augmented, not normalized)
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.uint8)


def check_augment_dtype(augment: Any, dtype: Any) -> None:
    """Refuse an `augment` that is not an `Augment`, a `dtype` the loop cannot receive."""
    if augment is not None and not isinstance(augment, Augment):
        raise OptionError(
            f"augment={augment!r}: give a gpufeed.data.Augment (your own batch transform "
            "goes in Augment(transform=...))"
        )
    if dtype is not None and dtype not in DTYPES:
        raise OptionError(
            f"dtype={dtype!r}: give one of {', '.join(map(str, DTYPES))} (uint8: the "
            "augmented pixels, not normalized)"
        )


def open_dataset(
    data: str | os.PathLike[str] | ShardDataset,
    drop_last: bool,
    dataset_options: dict[str, Any],
    takes: list[str],
) -> ShardDataset:
    """`data` as the Loader's dataset: a ready-made `ShardDataset` (no options for it), or one
    opened from a path with `dataset_options` (each among `takes`, the names the Loader and
    ShardDataset take)."""
    if isinstance(data, ShardDataset):
        if dataset_options:
            raise OptionError(
                f"options {sorted(dataset_options)} go to ShardDataset, which was given ready-made"
            )
        if drop_last and not data.drop_last and data.index.total % data.world_size:
            raise OptionError(
                "drop_last=True: the ShardDataset given ready-made pads its rank's share "
                "with repeated samples (its drop_last is False); build it with "
                "ShardDataset(..., drop_last=True), or give the Loader the shards' path"
            )
        return data
    known(
        "Loader",
        dataset_options,
        [n for n in takes if n not in ("data", "url", "dataset_options")],
    )
    return ShardDataset(data, drop_last=drop_last, **dataset_options)


def default_workers() -> int:
    """Cores per local rank (torchrun's LOCAL_WORLD_SIZE), less one for the training loop."""
    return max(1, cores_per_rank() - 1)
