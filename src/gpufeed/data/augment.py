"""Augmentations as batched torch ops: the same code runs on CPU tensors and, unchanged, on a GPU.

The default is the standard ImageNet training recipe: random-resized crop (scale 0.08-1, ratio
3/4-4/3), horizontal flip, normalize. `Augment.load_factor(L)` is the seed experiments' heavy
recipe: the load block (horizontal flip, vertical flip, ±15° rotation) repeated L times.

The load block is a list of affine warps, one N×2×3 sampling matrix per repetition with its
flips folded in; `fused=True` composes all repetitions into one warp, which is equivalent up to
interpolation. The first warp is applied straight to the random-resized crop box of the decoded
image, so crop + resize + the first repetition are ONE resampling (a warp that only flips is a
flip of the resized crop); each further repetition (unfused) is one more real resampling.
Normalization is one multiply and one subtract, the subtract writing into the output batch. All
random parameters come from a CPU `torch.Generator`, so the CPU and GPU paths draw the same
crops, flips and angles for the same seed.

`transform` is the user's own batched transform (torchvision.transforms.v2 or kornia style, a
callable on a batch tensor): with `transform_on="worker"` it runs in the loader's worker
processes on each uint8 N×3×H×W batch after crop, resize and flips, before normalization, and
must return a uint8 batch of that shape; with `"device"` it runs on the loader's device stage on
the finished batch (normalized float, or uint8 with `dtype=torch.uint8`) and may return any
tensor. A worker transform must be picklable where workers are spawned, not forked.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpufeed.data.options import ordered, real, several, whole
from gpufeed.data.param_columns import Column
from gpufeed.errors import OptionError

if TYPE_CHECKING:
    import torch

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# Bilinear sampling without antialiasing aliases when shrinking by more than this; a crop that
# must shrink more is first resized with the antialiased uint8 resize, then warped.
MAX_WARP_DOWNSCALE = 1.5

Box = tuple[int, int, int, int]  # top, left, height, width in source pixels


TRANSFORM_PLACES = ("worker", "device")


@dataclass(frozen=True)
class Augment:
    """What to do to each image. The defaults are the ImageNet training recipe; `train=False`
    gives a deterministic center crop and no flips; `Augment.load_factor(L)` the heavy recipe."""

    size: tuple[int, int] = (224, 224)
    train: bool = True
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    load: int = 1
    hflip: float = 0.5
    vflip: float = 0.0
    degrees: float = 0.0
    fused: bool = False
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    eval_crop: float = 0.875
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None
    transform_on: str = "worker"

    def __post_init__(self) -> None:
        size = self.size
        if isinstance(size, int) and not isinstance(size, bool):
            size = (size, size)
        if not isinstance(size, (tuple, list)) or len(size) != 2:
            raise OptionError(f"Augment size must be an integer or (height, width), got {size!r}")
        fix = functools.partial(object.__setattr__, self)  # a frozen dataclass
        fix("size", tuple(whole("Augment size", v, 1) for v in size))
        fix("scale", ordered("Augment scale", self.scale, 0.0, 1.0))
        fix("ratio", ordered("Augment ratio", self.ratio, 0.0, 1000.0))
        fix("load", whole("Augment load", self.load, 0))
        for name in ("hflip", "vflip"):  # probabilities; False / True: never / always
            fix(name, real(f"Augment {name}", getattr(self, name), 0.0, 1.0, flag=True))
        fix("degrees", real("Augment degrees", self.degrees, -360.0, 360.0))  # ± either way
        fix("eval_crop", real("Augment eval_crop", self.eval_crop, 0.0, 1.0, above_low=True))
        fix("mean", several("Augment mean", self.mean, 3, 0.0, 1.0))
        fix("std", several("Augment std", self.std, 3, 0.0, 1.0, above_low=True))
        if self.transform_on not in TRANSFORM_PLACES:
            raise OptionError(
                f"transform_on={self.transform_on!r}: choose one of {', '.join(TRANSFORM_PLACES)}"
            )
        if self.transform is not None and not callable(self.transform):
            raise OptionError(
                f"transform must be a callable on a batch tensor, got {type(self.transform).__name__}"
            )

    @classmethod
    def load_factor(cls, load: int, **options: Any) -> Augment:
        """The seed experiments' recipe: random-resized crop, then horizontal flip, vertical flip
        and a rotation of up to ±15°, repeated `load` times (the classic augmentation-load knob)."""
        options = {"hflip": 0.5, "vflip": 0.5, "degrees": 15.0, **options}
        return cls(load=load, **options)

    def worker_transform(self, batch: torch.Tensor) -> torch.Tensor:
        """The user's worker transform on a uint8 N×3×H×W batch, checked to give one back."""
        import torch

        assert self.transform is not None
        out = self.transform(batch)
        if (
            not isinstance(out, torch.Tensor)
            or out.shape != batch.shape
            or out.dtype != batch.dtype
        ):
            got = (
                f"{tuple(out.shape)} {out.dtype}"
                if isinstance(out, torch.Tensor)
                else type(out).__name__
            )
            raise OptionError(
                f"Augment.transform (transform_on='worker') returned {got}; it must return a "
                f"uint8 batch of the shape it was given, {tuple(batch.shape)} (use "
                "transform_on='device' to change shape or dtype)"
            )
        return out

    # --- parameters (all drawn on CPU from `gen`) -------------------------------------------------

    def boxes(self, sizes: list[tuple[int, int]], gen: torch.Generator) -> list[Box]:
        """A crop box per image: random-resized crop (10 tries, then center) or the eval crop."""
        import torch

        n = len(sizes)
        out_h, out_w = self.size
        if not self.train:
            boxes = []
            for h, w in sizes:
                s = min(h / out_h, w / out_w) * self.eval_crop
                bh, bw = max(1, round(out_h * s)), max(1, round(out_w * s))
                boxes.append(((h - bh) // 2, (w - bw) // 2, bh, bw))
            return boxes
        tries = 10
        area_frac = torch.empty(n, tries).uniform_(*self.scale, generator=gen)
        log_r = torch.empty(n, tries).uniform_(
            math.log(self.ratio[0]), math.log(self.ratio[1]), generator=gen
        )
        pos = torch.rand(n, tries, 2, generator=gen)
        if n == 0:
            return []
        hw = torch.tensor(sizes, dtype=torch.long).view(n, 1, 2)  # all tries of all images at once
        area = (hw[..., 0] * hw[..., 1]).float() * area_frac
        r = torch.exp(log_r)
        bw = torch.sqrt(area * r).round().long()
        bh = torch.sqrt(area / r).round().long()
        fits = (bw > 0) & (bw <= hw[..., 1]) & (bh > 0) & (bh <= hw[..., 0])
        y = (pos[..., 0] * (hw[..., 0] - bh + 1)).long()
        x = (pos[..., 1] * (hw[..., 1] - bw + 1)).long()
        first = fits.int().argmax(1, keepdim=True)  # the first try that fits
        picked = torch.cat([t.gather(1, first) for t in (y, x, bh, bw)], 1).tolist()
        found = fits.any(1).tolist()
        return [
            tuple(picked[i]) if found[i] else self._center_box(*sizes[i])  # type: ignore[misc]
            for i in range(n)
        ]

    def _center_box(self, h: int, w: int) -> Box:
        r0 = w / h
        bh0, bw0 = (h, round(h * self.ratio[1])) if r0 > self.ratio[1] else (h, w)
        if r0 < self.ratio[0]:
            bh0, bw0 = round(w / self.ratio[0]), w
        bh0, bw0 = min(bh0, h), min(bw0, w)
        return ((h - bh0) // 2, (w - bw0) // 2, bh0, bw0)

    def flips_and_angles(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        """(hflip [L,n] bool, vflip [L,n] bool, angle [L,n] radians) for the load block."""
        import torch

        L = self.load if self.train else 0
        h = torch.rand(L, n, generator=gen) < self.hflip
        v = torch.rand(L, n, generator=gen) < self.vflip
        a = (torch.rand(L, n, generator=gen) * 2 - 1) * math.radians(self.degrees)
        return h, v, a

    def drawn_columns(self) -> tuple[Column, ...]:
        """The per-image parameters the ops draw (`boxes`, `flips_and_angles`), as the slot
        columns that carry them to a device that decodes: the crop box (top, left, height,
        width) and, per repetition of the load block, its flips and angle."""
        reps = self.load if self.train else 0
        return (
            Column("box", 4, "int"),
            Column("hflip", reps, "bool"),
            Column("vflip", reps, "bool"),
            Column("angle", reps, "float"),
        )

    def later_warp_columns(self) -> tuple[Column, ...]:
        """The columns of the load block's warps after the first (a 2×3 sampling matrix each),
        which a device applies to images that workers took through the first."""
        return (Column("warps", 6 * max(0, self.warp_count - 1), "float"),)

    @property
    def warp_count(self) -> int:
        """Sampling matrices per image in the load block: none, one if fused, else one per
        repetition (what `warps` returns)."""
        reps = self.load if self.train else 0
        return min(reps, 1) if self.fused else reps

    def warps(self, params: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
        """The load block as N×2×3 sampling matrices: one per repetition, or one in all if fused."""
        hflip, vflip, angle = params
        if hflip.shape[0] == 0:
            return []
        if self.fused:
            return [_compose(hflip, vflip, angle)]
        return [
            _compose(hflip[i : i + 1], vflip[i : i + 1], angle[i : i + 1])
            for i in range(len(hflip))
        ]

    def min_decode_size(self, size: tuple[int, int], box: Box) -> tuple[int, int]:
        """Smallest decoded (height, width) whose scaled box still covers the output: lets the
        JPEG decoder DCT-scale (in 1/8 steps) when the crop is much larger than the output."""
        h, w = size
        _, _, bh, bw = box
        return math.ceil(self.size[0] * h / bh), math.ceil(self.size[1] * w / bw)

    # --- the ops ------------------------------------------------------------------------------

    def crop_resize(
        self, image: torch.Tensor, full: tuple[int, int], box: Box, contiguous: bool = True
    ) -> torch.Tensor:
        """Crop `box` (in `full`-size pixels) from a HxWx3 uint8 image that may be decoded
        smaller than `full`, and resize it (bilinear, antialiased) to the output size: 3xHxW
        uint8 (`contiguous=False`: in whatever memory layout the resize produced)."""
        import torch
        import torch.nn.functional as F

        crop = _crop(image, full, box)
        if crop.shape[-2:] == self.size:
            out = crop
        elif crop.device.type == "cpu":  # torch's fast uint8 path (AVX2) on CPU
            # on a dense copy of the crop view: 0.2-0.3 ms instead of 0.4-0.5 (same result)
            crop = crop.contiguous(memory_format=torch.channels_last)
            out = F.interpolate(crop, size=self.size, mode="bilinear", antialias=True)
        else:
            out = F.interpolate(crop.float(), size=self.size, mode="bilinear", antialias=True)
            out = out.round_().clamp_(0, 255).to(torch.uint8)
        return out[0].contiguous() if contiguous else out[0]

    def crop_warp(
        self, image: torch.Tensor, full: tuple[int, int], box: Box, theta: torch.Tensor
    ) -> torch.Tensor:
        """Crop `box`, resize to the output size and warp by `theta` (1×2×3) in one bilinear
        resampling of the decoded uint8 HxWx3 image: 1×3×H×W float in 0..255."""
        crop = _crop(image, full, box)
        if max(crop.shape[-2] / self.size[0], crop.shape[-1] / self.size[1]) > MAX_WARP_DOWNSCALE:
            crop = self.crop_resize(image, full, box, contiguous=False).unsqueeze(0)
        return _warp(crop.float(), theta, self.size)

    def first_pass(
        self,
        image: torch.Tensor,
        full: tuple[int, int],
        box: Box,
        warps: list[torch.Tensor],
        i: int,
    ) -> torch.Tensor:
        """Image i of a batch through crop, resize and the first warp: 1×3×H×W (uint8 if none)."""
        if not warps:
            return self.crop_resize(image, full, box, contiguous=False).unsqueeze(0)
        theta = warps[0][i : i + 1]
        flips = _flip_dims(theta) if theta.device.type == "cpu" else None
        if flips is not None:  # no resampling needed beyond the resize: flip the uint8 result
            x = self.crop_resize(image, full, box, contiguous=False).unsqueeze(0)
            return x.flip(flips) if flips else x
        return self.crop_warp(image, full, box, theta)

    def finish(
        self, x: torch.Tensor, warps: list[torch.Tensor], out: torch.Tensor, owned: bool = False
    ) -> torch.Tensor:
        """The remaining warps on N×3×H×W `x`, then normalization (float `out`) or rounding
        (uint8 `out`), written into `out` (any memory format, on x's device). `owned`: a float
        `x` may be overwritten, which saves a pass."""
        import torch

        for theta in warps:
            x = _warp(x.float(), theta, tuple(out.shape[-2:]))
            owned = True
        if out.dtype == torch.uint8:
            if x.dtype == torch.uint8:
                return out.copy_(x)
            x = (x.round_() if owned else x.round()).clamp_(0, 255).to(torch.uint8)
            if (
                out.device.type == "cpu"
                and _pixels_last(out)
                and not x.is_contiguous(memory_format=torch.channels_last)
            ):
                # interleave the planes into N×H×W×3 memory: 0.1 ms instead of 0.17 per 224² image
                torch.stack(x.unbind(1), dim=-1, out=out.permute(0, 2, 3, 1))
                return out
            return out.copy_(x)
        if x.dtype == torch.uint8 and out.device.type == "cpu" and out.dtype == torch.float32:
            last = _pixels_last(out)
            if last or out.is_contiguous():
                return _normalize_uint8(x, out, self.mean, self.std, last)
        scale, shift = _normalizer(self.mean, self.std, x.device)
        if x.dtype == torch.uint8:
            x, owned = x.float(), True
        x = x.mul_(scale) if owned else x * scale
        return torch.sub(x, shift, out=out)

    def apply_batch(
        self,
        x: torch.Tensor,
        params: tuple[torch.Tensor, ...],
        dtype: torch.dtype,
        channels_last: bool = False,
    ) -> torch.Tensor:
        """The load block, then normalization (float) or rounding (uint8), on x's device.

        `x` is N×3×H×W, uint8 or float in 0..255 (already cropped and resized).
        """
        import torch

        fmt = torch.channels_last if channels_last else torch.contiguous_format
        out = torch.empty(x.shape, dtype=dtype, device=x.device, memory_format=fmt)
        return self.finish(x, self.warps(params), out)


def crop_span(
    decoded: tuple[int, int], full: tuple[int, int], box: Box
) -> tuple[int, int, int, int]:
    """(y0, y1, x0, x1): the rows and columns of an image decoded at `decoded` size that `box`
    (in `full`-size pixels) covers; the one rule every decoder and crop uses."""
    sy, sx = decoded[0] / full[0], decoded[1] / full[1]
    y, x, bh, bw = box
    y0, x0 = int(y * sy), int(x * sx)
    y1 = max(y0 + 1, min(decoded[0], round((y + bh) * sy)))
    x1 = max(x0 + 1, min(decoded[1], round((x + bw) * sx)))
    return y0, y1, x0, x1


def _crop(image: torch.Tensor, full: tuple[int, int], box: Box) -> torch.Tensor:
    """`box` (in `full`-size pixels) of a HxWx3 image decoded at any size: a 1×3×h×w view."""
    y0, y1, x0, x1 = crop_span((image.shape[0], image.shape[1]), full, box)
    # a channels_last view; batch dim first, so a dense crop has the strides torch's kernels take
    # for channels_last (a region decoded to the crop needs no copy)
    return image[y0:y1, x0:x1].unsqueeze(0).permute(0, 3, 1, 2)


def _flip_dims(theta: torch.Tensor) -> list[int] | None:
    """The dims a 1×2×3 sampling matrix flips if it only flips (no rotation, no shift), else None."""
    (a, b, c), (d, e, f) = theta[0].tolist()
    if b or d or c or f or abs(a) != 1 or abs(e) != 1:
        return None
    return [-1] * (a < 0) + [-2] * (e < 0)


def _rotation(angle: torch.Tensor) -> torch.Tensor:
    import torch

    c, s = torch.cos(angle), torch.sin(angle)
    z = torch.zeros_like(c)
    return torch.stack([torch.stack([c, -s, z], -1), torch.stack([s, c, z], -1)], 1)


def _compose(hflip: torch.Tensor, vflip: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
    """One N×2×3 sampling matrix equal to applying, per repetition, hflip, vflip, rotation."""
    import torch

    n = hflip.shape[1]
    m = torch.eye(2, device=hflip.device).expand(n, 2, 2).clone()
    for i in range(hflip.shape[0]):
        f = torch.ones(n, 2, device=hflip.device)
        f[:, 0] = torch.where(hflip[i], -1.0, 1.0)
        f[:, 1] = torch.where(vflip[i], -1.0, 1.0)
        # Repetition i samples its input at F_h F_v R p, so k repetitions sample at M_1 ... M_k p.
        m = m @ (torch.diag_embed(f) @ _rotation(angle[i])[:, :, :2])
    return torch.cat([m, torch.zeros(n, 2, 1, device=m.device)], 2)


@functools.lru_cache(maxsize=16)
def _centres(h: int, w: int, device: Any, dtype: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(1×1×w, 1×h×1) pixel centres in normalized coordinates (as affine_grid,
    align_corners=False)."""
    import torch

    x = torch.arange(w, dtype=torch.float64).mul_(2).add_(1).div_(w).sub_(1)
    y = torch.arange(h, dtype=torch.float64).mul_(2).add_(1).div_(h).sub_(1)
    return x.to(device, dtype).view(1, 1, w), y.to(device, dtype).view(1, h, 1)


def sampling_grid(theta: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """N×H×W×2 sampling grid of the N×2×3 matrices `theta` over an output of `size`: what
    affine_grid(align_corners=False) gives, built from its rows and columns (one broadcast add
    per coordinate, a third of the cost of a matmul over every pixel)."""
    import torch

    n, (h, w) = theta.shape[0], size
    x, y = _centres(h, w, theta.device, theta.dtype)
    t = theta.reshape(n, 6, 1, 1)
    grid = torch.empty((n, h, w, 2), dtype=theta.dtype, device=theta.device)
    for k in (0, 1):  # g_k = t[k,0]·x + t[k,1]·y + t[k,2]
        row = torch.addcmul(t[:, 3 * k + 2], t[:, 3 * k + 1], y)  # N×h×1
        torch.addcmul(row, t[:, 3 * k], x, out=grid[..., k])
    return grid


@functools.lru_cache(maxsize=16)
def _normalizer(mean: tuple[float, ...], std: tuple[float, ...], device: Any) -> tuple[Any, Any]:
    """(scale, shift) with x·scale − shift = (x/255 − mean)/std, each 1×3×1×1."""
    import torch

    m = torch.tensor(mean, device=device).view(1, 3, 1, 1)
    s = torch.tensor(std, device=device).view(1, 3, 1, 1)
    return 1 / (255 * s), m / s


def _pixels_last(t: torch.Tensor) -> bool:
    """Whether N×3×H×W `t` is dense with channels innermost (N×H×W×3 memory)."""
    return t.permute(0, 2, 3, 1).is_contiguous()


def _normalize_uint8(
    x: torch.Tensor,
    out: torch.Tensor,
    mean: tuple[float, ...],
    std: tuple[float, ...],
    last: bool,
) -> torch.Tensor:
    """Normalize uint8 `x` into dense CPU float32 `out` (N×H×W×3 memory if `last`, else
    N×3×H×W): the same values as x·scale − shift.
    `x` is laid out like `out` (moving bytes is cheaper than moving floats), copied in as floats,
    and the arithmetic runs in `out`. With channels innermost, a 1×3×1×1 broadcast would run
    loops of 3 elements, so rows of k pixels meet a scale tiled k times instead. Per 224² image:
    0.21 ms instead of 0.29 into N×3×H×W memory, 0.11 ms instead of 0.57 into N×H×W×3."""
    import torch

    out.copy_(x.contiguous(memory_format=torch.channels_last if last else torch.contiguous_format))
    if not last:
        scale, shift = _normalizer(mean, std, out.device)
        return out.mul_(scale).sub_(shift)
    scale, shift = _tiled_normalizer(mean, std, out.numel() // 3)
    out.permute(0, 2, 3, 1).view(-1, scale.shape[1]).mul_(scale).sub_(shift)
    return out


@functools.lru_cache(maxsize=16)
def _tiled_normalizer(
    mean: tuple[float, ...], std: tuple[float, ...], pixels: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`_normalizer`'s (scale, shift) on the CPU, repeated for k pixels (the most, up to 64,
    that divide `pixels`): each 1×3k."""
    k = max(d for d in range(1, 65) if pixels % d == 0)
    scale, shift = _normalizer(mean, std, "cpu")
    return scale.view(3).repeat(k).view(1, 3 * k), shift.view(3).repeat(k).view(1, 3 * k)


def _warp(x: torch.Tensor, theta: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Sample N×C×h×w `x` at theta·p for every output pixel p of an N×C×size image (bilinear,
    zeros outside); the same result as affine_grid + grid_sample."""
    import torch.nn.functional as F

    theta = theta.to(device=x.device, dtype=x.dtype, non_blocking=True)
    grid = sampling_grid(theta, size)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
