"""Turn a list of raw samples into one augmented batch; shared by the CPU-worker and device paths."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from gpufeed.data.decode import CorruptImage, decode, image_size
from gpufeed.data.one_pass import compact, first_warp_flips, suits
from gpufeed.errors import GpufeedError

if TYPE_CHECKING:
    import torch

    from gpufeed.data.augment import Augment
    from gpufeed.data.dataset import RawSample

# decode(list of bytes, list of (min_h, min_w)) -> per image: HxWx3 uint8 tensor or an Exception;
# a decoder with `crops = True` is also given each image's crop box and its size (the header's, as
# read here) and may return a Region
Decoder = Callable[..., list]


class Region(NamedTuple):
    """A decoded image that covers exactly the crop box its decoder was given, at full size."""

    image: Any  # HxWx3 uint8 tensor


class CorruptSampleError(GpufeedError, ValueError):
    """strict=True: a sample could not be decoded; names its shard and key."""


def batch_generator(seed: int, epoch: int, rank: int, batch: int) -> torch.Generator:
    """The generator for batch `batch`'s random parameters: the same on every path and device,
    and for any number of workers."""
    import torch

    state = np.random.SeedSequence([seed, epoch, rank, batch]).generate_state(1)[0]
    return torch.Generator().manual_seed(int(state))


def cpu_decoder(datas: Sequence[bytes], min_sizes: Sequence[tuple[int, int]]) -> list:
    """libjpeg-turbo (DCT-scaled to the minimum size) / Pillow, one image at a time."""
    import torch

    out: list = []
    for data, (mh, mw) in zip(datas, min_sizes, strict=True):
        try:
            out.append(torch.from_numpy(decode(data, mh, mw)))
        except CorruptImage as e:
            out.append(e)
    return out


def _made_anyway(
    samples: Sequence[RawSample],
    ok: list[int],
    why: list[str | None],
    augment: Augment,
    drawn: tuple[list, list, list, list, list],
    out: torch.Tensor,
) -> list[int | tuple[str, str, str]]:
    """After the native pass: per image of `ok`, its index, made by the steps one by one where
    the pass could not make it (their verdict and message), or (shard, key, why) if corrupt."""
    datas, min_sizes, safe, boxes, warps = drawn
    keep: list[int | tuple[str, str, str]] = []
    for j, (i, reason) in enumerate(zip(ok, why, strict=True)):
        if reason is not None:
            img = cpu_decoder([datas[j]], [min_sizes[j]])[0]
            if isinstance(img, Exception):
                keep.append((samples[i].shard, samples[i].key, str(img)))
                continue
            x = augment.first_pass(img, safe[i], boxes[i], warps, i)
            augment.finish(x, [], out[j : j + 1], owned=True)
        keep.append(i)
    return keep


def _raise_if_strict(corrupt: list[tuple[str, str, str]], strict: bool) -> None:
    if corrupt and strict:
        shard, key, why = corrupt[0]
        raise CorruptSampleError(f"corrupt sample in shard {shard}, key {key}: {why}")


def new_batch(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str, channels_last: bool
) -> torch.Tensor:
    """An empty output batch."""
    import torch

    fmt = torch.channels_last if channels_last else torch.contiguous_format
    return torch.empty(shape, dtype=dtype, device=torch.device(device), memory_format=fmt)


def build_batch(
    samples: Sequence[RawSample],
    augment: Augment,
    gen: torch.Generator,
    *,
    dtype: torch.dtype,
    channels_last: bool,
    strict: bool,
    decoder: Decoder = cpu_decoder,
    device: torch.device | str = "cpu",
    per_image: bool | None = None,
    alloc: Callable[[tuple[int, ...]], torch.Tensor] | None = None,
    rest: list[torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, list[tuple[str, str, str]]]:
    """(images N×3×H×W, labels N, corrupt [(shard, key, reason)]); corrupt samples are left out.

    Random parameters are drawn for every sample, corrupt or not, so a bad image never shifts
    the augmentations of the others. `per_image` (default: on CPU) takes each image through all
    its steps while it is in cache, into its slot of the output batch; otherwise the steps
    after the first resampling run batched (fewer kernel launches on a GPU). Same result.
    `alloc(shape)` gives the output batch (default: `new_batch`). With a list `rest`, only the
    first warp of the load block is applied: the sampling matrices of the others (N×2×3 each, for
    the images kept) are appended to it, for the device stage to apply.
    """
    import torch

    n = len(samples)
    sizes: list[tuple[int, int] | Exception] = []
    for s in samples:
        try:
            sizes.append(image_size(s.data))
        except CorruptImage as e:
            sizes.append(e)
    safe = [sz if isinstance(sz, tuple) else (1, 1) for sz in sizes]
    boxes = augment.boxes(safe, gen)
    warps = [
        w.to(device, non_blocking=True) for w in augment.warps(augment.flips_and_angles(n, gen))
    ]
    ok = [i for i in range(n) if isinstance(sizes[i], tuple)]
    datas = [samples[i].data for i in ok]
    min_sizes = [augment.min_decode_size(safe[i], boxes[i]) for i in ok]
    corrupt = [(samples[i].shard, samples[i].key, str(sizes[i])) for i in range(n) if i not in ok]
    if per_image is None:
        per_image = torch.device(device).type == "cpu"
    later = [] if rest is not None else warps[1:]
    flips = None
    if per_image and not later and getattr(decoder, "fill", None) and suits(dtype, device):
        flips = first_warp_flips(warps, n)
    if flips is not None:  # one native pass from the bytes to the batch
        shape = (len(ok), 3, *augment.size)
        out = alloc(shape) if alloc else new_batch(shape, dtype, device, channels_last)
        args = (datas, [safe[i] for i in ok], [boxes[i] for i in ok], min_sizes, flips[ok], out)
        why = decoder.fill(augment, *args)
        keep = _made_anyway(samples, ok, why, augment, (datas, min_sizes, safe, boxes, warps), out)
        corrupt += [bad for bad in keep if isinstance(bad, tuple)]
        _raise_if_strict(corrupt, strict)
        kept = [j for j, i in enumerate(keep) if isinstance(i, int)]
        out = compact(out, kept) if len(kept) < len(ok) else out
        if rest is not None:
            rest += [w[[ok[j] for j in kept]] for w in warps[1:]]
        labels = torch.tensor([samples[ok[j]].label for j in kept], dtype=torch.long)
        return out, labels, corrupt
    if getattr(decoder, "crops", False):
        decoded = decoder(datas, min_sizes, [boxes[i] for i in ok], [safe[i] for i in ok])
    else:
        decoded = decoder(datas, min_sizes)
    keep, images = [], []
    for i, img in zip(ok, decoded, strict=True):
        if isinstance(img, Exception):
            corrupt.append((samples[i].shard, samples[i].key, str(img)))
        else:
            if isinstance(img, Region):  # the box alone: it is the whole (full-size) image now
                _, _, bh, bw = boxes[i]
                safe[i], boxes[i], img = (bh, bw), (0, 0, bh, bw), img.image
            keep.append(i)
            images.append(img)
    _raise_if_strict(corrupt, strict)
    shape = (len(keep), 3, *augment.size)
    out = alloc(shape) if alloc else new_batch(shape, dtype, device, channels_last)
    idx = torch.tensor(keep, dtype=torch.long)
    if rest is not None:
        rest += [w[idx] for w in warps[1:]]
    firsts = []
    for j, (i, img) in enumerate(zip(keep, images, strict=True)):
        x = augment.first_pass(img, safe[i], boxes[i], warps, i)
        if per_image:
            augment.finish(x, [w[i : i + 1] for w in later], out[j : j + 1], owned=True)
        else:
            firsts.append(x)
    if firsts:  # decoded here, finished where `out` is (the device, with decoder="cpu")
        x = torch.cat(firsts).to(out.device, non_blocking=True)
        augment.finish(x, [w[idx] for w in later], out, owned=True)
    labels = torch.tensor([samples[i].label for i in keep], dtype=torch.long)
    return out, labels, corrupt
