"""One pass from JPEG bytes to the batch: each image's crop region decoded, resized (antialiased),
flipped and written into its place in the output batch, normalized where the batch is float32,
by one native call per batch (`_jpeg_region.fill_batch`) with no per-image Python beyond the
parameters. The pixels are those of `build_batch`'s own steps (torch's uint8 antialiased resize,
its flips and its normalization), bit for bit; an image the native pass refuses is made by those
steps instead, so it gets their verdict and message.

Used where `build_batch` runs on the CPU with a decoder that has a `fill` (`jpeg_region`), the
load block's first warp only flips, and the batch is uint8 or float32 in N×3×H×W or N×H×W×3
memory; anything else takes the steps one by one.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from gpufeed.data.augment import Box, crop_span

if TYPE_CHECKING:
    import torch

    from gpufeed.data.augment import Augment
    from gpufeed.data.spec import BatchSpec

# Plan columns, as `_jpeg_region.fill_batch` reads them
DEST, SCALE, TOP, BOTTOM, LEFT, RIGHT, HFLIP, VFLIP = range(8)


def applies(spec: BatchSpec) -> bool:
    """Whether workers making `spec`'s batches take them in one native pass (given a decoder
    with a `fill`): the first warp of the load block only flips, the others (if any) are left to
    the device, and the slot is uint8 or float32."""
    import torch

    aug = spec.augment
    flips_only = not aug.train or aug.warp_count == 0 or aug.degrees == 0
    later = aug.warp_count > 1 and spec.handoff != "first_pass"
    user = aug.transform is not None and aug.transform_on == "worker"
    dtype = torch.uint8 if user else spec.host_dtype
    return flips_only and not later and dtype in (torch.uint8, torch.float32)


def first_warp_flips(warps: list[torch.Tensor], n: int) -> np.ndarray | None:
    """(hflip, vflip) per image (n×2 int32) where the load block's first warp only flips each
    image (no rotation, no shift), or no warp at all; None where one warp does more."""
    if not warps:
        return np.zeros((n, 2), np.int32)
    theta = warps[0].double().cpu().numpy()
    a, b, c, d, e, f = (theta[:, i // 3, i % 3] for i in range(6))
    if np.any(b) or np.any(c) or np.any(d) or np.any(f):
        return None
    if not (np.all(np.abs(a) == 1) and np.all(np.abs(e) == 1)):
        return None
    return np.stack([a < 0, e < 0], 1).astype(np.int32)


def suits(dtype: torch.dtype, device: torch.device | str) -> bool:
    """Whether the native pass can write a batch of this dtype on this device."""
    import torch

    return torch.device(device).type == "cpu" and dtype in (torch.uint8, torch.float32)


def slot_layout(out: torch.Tensor) -> tuple[np.ndarray, bool]:
    """(the batch's memory as an array, whether it is N×3×H×W) of a batch that `suits`, dense in
    either layout (`new_batch`'s, or a worker's slot)."""
    if not suits(out.dtype, out.device):
        raise ValueError(f"one_pass: a {out.dtype} batch on {out.device}")
    if out.is_contiguous():
        return out.numpy(), True
    last = out.permute(0, 2, 3, 1)
    if not last.is_contiguous():
        raise ValueError("one_pass: a batch neither N×3×H×W nor N×H×W×3 in memory")
    return last.numpy(), False


@functools.lru_cache(maxsize=16)
def norm_bytes(mean: tuple[float, ...], std: tuple[float, ...]) -> bytes:
    """The scale and shift `Augment.finish` normalizes with (float32, as torch computes them)."""
    from gpufeed.data.augment import _normalizer

    scale, shift = _normalizer(mean, std, "cpu")
    return np.concatenate([scale.view(3).numpy(), shift.view(3).numpy()]).astype("<f4").tobytes()


def plan(
    sizes: Sequence[tuple[int, int]],
    boxes: Sequence[Box],
    min_sizes: Sequence[tuple[int, int]],
    flips: np.ndarray,
    dct_scale: Callable[[tuple[int, int], tuple[int, int]], int],
) -> np.ndarray:
    """The native pass's plan: per image its place in the batch, DCT scale, crop rows and
    columns at that scale (`crop_span`, as every decoder crops) and flips."""
    rows = np.empty((len(sizes), 8), np.int32)
    for i, (size, box, min_size) in enumerate(zip(sizes, boxes, min_sizes, strict=True)):
        m = dct_scale(size, min_size)
        scaled = (math.ceil(size[0] * m / 8), math.ceil(size[1] * m / 8))
        rows[i, DEST], rows[i, SCALE] = i, m
        rows[i, TOP], rows[i, BOTTOM], rows[i, LEFT], rows[i, RIGHT] = crop_span(scaled, size, box)
    rows[:, HFLIP:] = flips
    return rows


def compact(out: torch.Tensor, kept: list[int]) -> torch.Tensor:
    """`out` with only the images at `kept` (ascending), moved to the front: the first
    len(kept) images."""
    for to, at in enumerate(kept):
        if to != at:
            out[to].copy_(out[at])
    return out[: len(kept)]


def fill(
    augment: Augment,
    datas: Sequence[bytes],
    rows: np.ndarray,
    out: torch.Tensor,
    margin: int,
    threads: int = 1,
) -> list[str | None]:
    """Run the native pass over `datas` into `out` (N images, in plan order); per image None or
    why it could not (those images are left for the caller)."""
    from gpufeed.data import _jpeg_region

    memory, nchw = slot_layout(out)
    norm = norm_bytes(augment.mean, augment.std) if memory.dtype == np.float32 else None
    h, w = augment.size
    return _jpeg_region.fill_batch(
        list(datas), rows.tobytes(), memory, h, w, nchw, norm, margin, threads
    )
