"""An embedded, photo-like image data set, so demos and benchmarks need no download.

Images are ImageFolder-style JPEGs with ImageNet-like sizes and varied aspect ratios, built from
1/f ("pink") noise, smooth gradients and hard-edged shapes, so that JPEG file sizes and decode
cost resemble real photos (about 100–200 KB at 400×500) rather than flat colours.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from gpufeed.atomic import write_atomic

_MARKER = ".gpufeed-synth.json"


def _pink_bank(rng: np.random.Generator, size: int = 1024) -> np.ndarray:
    """A size×size×3 field of 1/f noise (zero mean, unit std) to cut textures from."""
    fy = np.fft.fftfreq(size)[:, None]
    fx = np.fft.rfftfreq(size)[None, :]
    amp = 1.0 / np.maximum(np.hypot(fy, fx), 1.0 / size) ** 1.0
    out = np.empty((size, size, 3), np.float32)
    for c in range(3):
        spec = amp * np.exp(2j * np.pi * rng.random(amp.shape))
        field = np.fft.irfft2(spec, s=(size, size))
        out[..., c] = (field - field.mean()) / field.std()
    return out


def _image(rng: np.random.Generator, bank: np.ndarray, h: int, w: int) -> np.ndarray:
    size = bank.shape[0]
    y0, x0 = rng.integers(0, size - h), rng.integers(0, size - w)
    tex = bank[y0 : y0 + h, x0 : x0 + w]
    if rng.random() < 0.5:
        tex = tex[:, ::-1]
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    yy /= h
    xx /= w
    base = rng.uniform(40, 200, 3).astype(np.float32)
    grad = rng.uniform(-80, 80, (2, 3)).astype(np.float32)
    img = base + yy[..., None] * grad[0] + xx[..., None] * grad[1]
    img = img + tex * rng.uniform(32, 52)
    for _ in range(int(rng.integers(3, 9))):  # hard-edged shapes: ellipses and bars
        cy, cx = rng.uniform(0, h), rng.uniform(0, w)
        ry, rx = rng.uniform(0.05, 0.35) * h, rng.uniform(0.05, 0.35) * w
        mask = ((yy * h - cy) / ry) ** 2 + ((xx * w - cx) / rx) ** 2 < 1.0
        if rng.random() < 0.4:
            mask = (np.abs(yy * h - cy) < ry * 0.3) & (np.abs(xx * w - cx) < rx)
        img[mask] = img[mask] * 0.4 + rng.uniform(0, 255, 3).astype(np.float32) * 0.6
    img += rng.normal(0, 6, (h, w, 1)).astype(np.float32)  # sensor grain
    return np.clip(img, 0, 255).astype(np.uint8)


def make_image_folder(
    root: str | os.PathLike[str],
    n_images: int,
    n_classes: int,
    short_side: tuple[int, int] = (300, 500),
    seed: int = 0,
    quality: tuple[int, int] = (85, 95),
    aspect: tuple[float, float] = (0.75, 1.5),
) -> Path:
    """Write `n_images` JPEGs into `root/<class>/<name>.jpg` and return `root`.

    Idempotent: a folder already generated with the same arguments is returned untouched.
    """
    import simplejpeg

    if n_images < 1 or n_classes < 1:
        raise ValueError(f"n_images and n_classes must be >= 1, got {n_images}, {n_classes}")
    root = Path(root)
    params = {
        "n_images": n_images,
        "n_classes": n_classes,
        "short_side": list(short_side),
        "seed": seed,
        "quality": list(quality),
        "aspect": list(aspect),
        "version": 1,
    }
    marker = root / _MARKER
    if marker.is_file():
        try:
            if json.loads(marker.read_text()) == params:
                return root
        except ValueError:
            pass
    rng = np.random.default_rng(seed)
    long_max = int(short_side[1] * max(aspect[1], 1 / aspect[0])) + 1
    bank = _pink_bank(rng, size=max(1024, long_max + 2))
    classes = [f"class_{c:03d}" for c in range(n_classes)]
    for name in classes:
        (root / name).mkdir(parents=True, exist_ok=True)
    for i in range(n_images):
        s = int(rng.integers(short_side[0], short_side[1] + 1))
        a = float(rng.uniform(*aspect))
        h, w = (s, int(s * a)) if a >= 1 else (int(s / a), s)
        img = _image(rng, bank, h, w)
        q = int(rng.integers(quality[0], quality[1] + 1))
        data = simplejpeg.encode_jpeg(np.ascontiguousarray(img), quality=q, colorsubsampling="420")
        path = root / classes[i % n_classes] / f"img_{i:06d}.jpg"
        write_atomic(path, data, tmp=path.with_suffix(".tmp"))
    marker.write_text(json.dumps(params))
    return root
