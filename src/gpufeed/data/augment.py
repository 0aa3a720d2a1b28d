"""Augmentations as batched torch ops: the same code runs on CPU tensors and, unchanged, on a GPU.

Per image only the random-resized crop (a slice) and the resize to the output size; everything
after runs once per batch: the load-factor block (horizontal flip, vertical flip, rotation,
repeated `load` times — the classic way to emulate a heavy augmentation pipeline), then
normalization. `fused=False` (default) applies the L repetitions one by one so the load is
real; `fused=True` composes them into one resampling, which is equivalent up to interpolation.
All random parameters come from a CPU `torch.Generator`, so the CPU and GPU paths draw the same
crops, flips and angles for the same seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

Box = tuple[int, int, int, int]  # top, left, height, width in source pixels


@dataclass(frozen=True)
class Augment:
    """What to do to each image; `train=False` gives a deterministic center crop and no flips."""

    size: tuple[int, int] = (224, 224)
    train: bool = True
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    load: int = 1
    hflip: float = 0.5
    vflip: float = 0.5
    degrees: float = 15.0
    fused: bool = False
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    eval_crop: float = 0.875

    def __post_init__(self) -> None:
        if isinstance(self.size, int):
            object.__setattr__(self, "size", (self.size, self.size))
        if self.load < 0:
            raise ValueError(f"augmentation load must be >= 0, got {self.load}")

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
        boxes = []
        for i, (h, w) in enumerate(sizes):
            area = h * w * area_frac[i]
            r = torch.exp(log_r[i])
            bw = torch.sqrt(area * r).round().long().tolist()
            bh = torch.sqrt(area / r).round().long().tolist()
            for t in range(tries):
                if 0 < bw[t] <= w and 0 < bh[t] <= h:
                    y = int(pos[i, t, 0] * (h - bh[t] + 1))
                    x = int(pos[i, t, 1] * (w - bw[t] + 1))
                    boxes.append((y, x, bh[t], bw[t]))
                    break
            else:
                r0 = w / h
                bh0, bw0 = (h, round(h * self.ratio[1])) if r0 > self.ratio[1] else (h, w)
                if r0 < self.ratio[0]:
                    bh0, bw0 = round(w / self.ratio[0]), w
                bh0, bw0 = min(bh0, h), min(bw0, w)
                boxes.append(((h - bh0) // 2, (w - bw0) // 2, bh0, bw0))
        return boxes

    def flips_and_angles(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        """(hflip [L,n] bool, vflip [L,n] bool, angle [L,n] radians) for the load block."""
        import torch

        L = self.load if self.train else 0
        h = torch.rand(L, n, generator=gen) < self.hflip
        v = torch.rand(L, n, generator=gen) < self.vflip
        a = (torch.rand(L, n, generator=gen) * 2 - 1) * math.radians(self.degrees)
        return h, v, a

    def min_decode_size(self, size: tuple[int, int], box: Box) -> tuple[int, int]:
        """Smallest decoded (height, width) whose scaled box still covers the output: lets the
        JPEG decoder DCT-scale (in 1/8 steps) when the crop is much larger than the output."""
        h, w = size
        _, _, bh, bw = box
        return math.ceil(self.size[0] * h / bh), math.ceil(self.size[1] * w / bw)

    # --- the ops ------------------------------------------------------------------------------

    def crop_resize(self, image: torch.Tensor, full: tuple[int, int], box: Box) -> torch.Tensor:
        """Crop `box` (in `full`-size pixels) from a HxWx3 uint8 image that may be decoded
        smaller than `full`, and resize it (bilinear, antialiased) to the output size: 3xHxW uint8."""
        import torch
        import torch.nn.functional as F

        sy, sx = image.shape[0] / full[0], image.shape[1] / full[1]
        y, x, bh, bw = box
        y0, x0 = int(y * sy), int(x * sx)
        y1 = max(y0 + 1, min(image.shape[0], round((y + bh) * sy)))
        x1 = max(x0 + 1, min(image.shape[1], round((x + bw) * sx)))
        crop = image[y0:y1, x0:x1].permute(2, 0, 1).unsqueeze(0)  # a channels_last view
        if crop.shape[-2:] == self.size:
            return crop[0].contiguous()
        if crop.device.type == "cpu":  # torch's fast uint8 path (AVX2) on CPU
            out = F.interpolate(crop, size=self.size, mode="bilinear", antialias=True)
        else:
            out = F.interpolate(crop.float(), size=self.size, mode="bilinear", antialias=True)
            out = out.round_().clamp_(0, 255).to(torch.uint8)
        return out[0].contiguous()

    def apply_batch(
        self,
        x: torch.Tensor,
        params: tuple[torch.Tensor, ...],
        dtype: torch.dtype,
        channels_last: bool = False,
    ) -> torch.Tensor:
        """The load block, then normalization (float) or rounding (uint8), on x's device.

        `x` is N×3×H×W, uint8 or float in 0..255; flips run in place on the flipped samples only.
        """
        import torch

        hflip, vflip, angle = (p.to(x.device, non_blocking=True) for p in params)
        if self.fused and hflip.shape[0] > 0:
            x = _warp(x.float(), _compose(hflip, vflip, angle))
        else:
            for i in range(hflip.shape[0]):
                x = _flip_some(x, hflip[i], -1)
                x = _flip_some(x, vflip[i], -2)
                x = _warp(x.float(), _rotation(angle[i]))
        if dtype == torch.uint8:
            if x.dtype != torch.uint8:
                x = x.round_().clamp_(0, 255).to(torch.uint8)
        else:
            mean = torch.tensor(self.mean, device=x.device).view(1, 3, 1, 1) * 255
            inv_std = 1.0 / (torch.tensor(self.std, device=x.device).view(1, 3, 1, 1) * 255)
            x = x.float().sub_(mean).mul_(inv_std).to(dtype)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x


def _flip_some(x: torch.Tensor, mask: torch.Tensor, dim: int) -> torch.Tensor:
    idx = mask.nonzero().flatten()
    if len(idx):
        x[idx] = x[idx].flip(dim)
    return x


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


def _warp(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    import torch.nn.functional as F

    grid = F.affine_grid(theta.to(x.dtype), list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
