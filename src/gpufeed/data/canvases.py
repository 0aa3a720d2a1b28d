"""Decoded images of different sizes resampled as one batch: zero-padded canvases, then crop,
resize and the first warp of the load block in one supersampled bilinear pass (GPU preprocessing:
the device stage's `resample` step). Pure torch functions, the same on any device."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from gpufeed.data.augment import Box, sampling_grid

MAX_TAPS = 3  # supersampling taps per axis: antialiasing for downscales up to 3×
CANVAS_ELEMENTS = 1 << 28  # images per resampling pass are limited to this many canvas elements


def fill_canvases(
    images: Sequence[torch.Tensor], dtype: torch.dtype | None = None
) -> list[torch.Tensor]:
    """uint8 3×h×w images → zero-padded float N×3×H×W canvases (several if one would exceed
    `CANVAS_ELEMENTS`), filled with one multi-tensor copy each."""
    if not images:
        return []
    device = images[0].device
    if dtype is None:
        dtype = torch.float16 if device.type == "cuda" else torch.float32
    hmax = max(int(im.shape[1]) for im in images)
    wmax = max(int(im.shape[2]) for im in images)
    per = max(1, CANVAS_ELEMENTS // (3 * hmax * wmax))
    out = []
    for i in range(0, len(images), per):
        part = images[i : i + per]
        out.append(_canvas(list(part), dtype, hmax, wmax))
    return out


def padded_canvases(padded: torch.Tensor, dtype: torch.dtype | None = None) -> list[torch.Tensor]:
    """uint8 N×H×W×3 images, zero-padded to one size (DALI's output) → float N×3×H×W canvases,
    as `fill_canvases` makes them (several if one would exceed `CANVAS_ELEMENTS`)."""
    n, h, w, _ = padded.shape
    if dtype is None:
        dtype = torch.float16 if padded.device.type == "cuda" else torch.float32
    per = max(1, CANVAS_ELEMENTS // (3 * h * w))
    return [
        padded[i : i + per].permute(0, 3, 1, 2).to(dtype, memory_format=torch.contiguous_format)
        for i in range(0, n, per)
    ]


def _canvas(part: list[torch.Tensor], dtype: torch.dtype, hmax: int, wmax: int) -> torch.Tensor:
    """One zero-padded canvas (zeros around each image: warps reaching past it sample black, as
    on CPU workers), in a few calls: a nested tensor padded by one kernel; per-image copies only
    where nested tensors cannot do it."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # nested tensors are a "prototype"
            nested = torch.nested.as_nested_tensor(part).to(dtype)
            return nested.to_padded_tensor(0.0, (len(part), 3, hmax, wmax))
    except (RuntimeError, NotImplementedError):
        canvas = torch.zeros((len(part), 3, hmax, wmax), dtype=dtype, device=part[0].device)
        dst = [canvas[k, :, : im.shape[1], : im.shape[2]] for k, im in enumerate(part)]
        torch._foreach_copy_(dst, part)
        return canvas


def sample_canvases(
    canvases: Sequence[torch.Tensor],
    boxes: Sequence[Box],
    theta: torch.Tensor | None,
    size: tuple[int, int],
) -> torch.Tensor:
    """Crop `boxes` (top, left, height, width, in canvas pixels of image k) out of the canvases,
    resize them to `size` and warp them by `theta` (N×2×3, as `Augment.crop_warp`), as one
    bilinear resampling per canvas: float N×3×H×W in 0..255. Each output pixel averages t×t
    samples spread over its footprint (t = the largest downscale, at most `MAX_TAPS`), which
    antialiases the shrinking crops."""
    parts, start = [], 0
    for canvas in canvases:
        n = canvas.shape[0]
        th = None if theta is None else theta[start : start + n]
        parts.append(_sample(canvas, boxes[start : start + n], th, size))
        start += n
    if not parts:
        return torch.empty((0, 3, *size))
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def resample_batch(
    images: Sequence[torch.Tensor],
    boxes: Sequence[Box],
    theta: torch.Tensor | None,
    size: tuple[int, int],
) -> torch.Tensor:
    """`fill_canvases` then `sample_canvases`: crop, resize and warp uint8 3×h×w images."""
    if not images:
        return torch.empty((0, 3, *size))
    return sample_canvases(fill_canvases(images), boxes, theta, size)


def _sample(
    canvas: torch.Tensor, boxes: Sequence[Box], theta: torch.Tensor | None, size: tuple[int, int]
) -> torch.Tensor:
    n, _, hmax, wmax = canvas.shape
    device, canvas_dtype = canvas.device, canvas.dtype
    out_h, out_w = size
    scale = max(max(b[2] / out_h, b[3] / out_w) for b in boxes)
    taps = min(MAX_TAPS, max(1, math.ceil(scale - 0.25)))
    b = torch.tensor(boxes, dtype=torch.float64).view(n, 4)  # top, left, height, width
    t = torch.eye(2, 3, dtype=torch.float64).expand(n, 2, 3) if theta is None else theta.double()
    t = t.cpu()
    # canvas-normalized g = s·(theta·p) + o, with s = box/canvas size, o = (2·offset + box)/canvas − 1
    sx, sy = b[:, 3] / wmax, b[:, 2] / hmax
    ox, oy = (2 * b[:, 1] + b[:, 3]) / wmax - 1, (2 * b[:, 0] + b[:, 2]) / hmax - 1
    a = torch.stack([t[:, 0] * sx[:, None], t[:, 1] * sy[:, None]], 1)
    a[:, 0, 2] += ox
    a[:, 1, 2] += oy
    a = a.float()
    steps = [((k + 0.5) / taps - 0.5) for k in range(taps)]  # sub-pixel offsets, in output pixels
    d = torch.tensor([[2 * dx / out_w, 2 * dy / out_h] for dy in steps for dx in steps])
    shifts = torch.einsum("nij,tj->tni", a[:, :, :2], d)  # taps²×N×2, in canvas coordinates
    if taps > 1:  # spread each image's taps over its own footprint: none at 1:1 or upscaling
        own = torch.maximum(b[:, 2] / out_h, b[:, 3] / out_w).float()
        shifts *= ((own - 1) / (taps - 1)).clamp(0, 1).view(1, n, 1)
    host = torch.cat([a.flatten(), shifts.flatten()])
    if device.type == "cuda":  # one copy, from page-locked memory: no wait for the stream
        host = host.pin_memory()
    dev = host.to(device, non_blocking=True)
    a = dev[: n * 6].view(n, 2, 3)
    shifts = dev[n * 6 :].view(taps * taps, n, 1, 1, 2)
    grid = sampling_grid(a, (out_h, out_w))
    if taps == 1:
        return F.grid_sample(canvas, grid.to(canvas_dtype), align_corners=False).float()
    acc = None
    for shift in shifts:
        s = F.grid_sample(canvas, (grid + shift).to(canvas_dtype), align_corners=False)
        acc = s.float() if acc is None else acc.add_(s)
    assert acc is not None
    return acc.div_(taps * taps)
