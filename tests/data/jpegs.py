"""Photo-like JPEGs made in memory for the decoder tests: smooth gradients with edges and noise,
so chroma upsampling and resampling have something to blend."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image


def photo(h: int, w: int, seed: int) -> np.ndarray:
    """An h×w×3 uint8 image: gradients, a repeating edge pattern and some noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 / w, y * 255 / h, (x + y) % 97 * 2.6], -1)
    return np.clip(base + rng.normal(0, 12, (h, w, 3)), 0, 255).astype(np.uint8)


def jpeg(h: int = 301, w: int = 437, seed: int = 0, **save: object) -> bytes:
    """`photo` saved as a JPEG (quality 90 unless `save` says otherwise)."""
    buf = io.BytesIO()
    Image.fromarray(photo(h, w, seed)).save(buf, "JPEG", **{"quality": 90, **save})
    return buf.getvalue()
