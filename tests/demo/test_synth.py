"""The embedded data set: photo-like JPEGs of ImageNet-like sizes, deterministic and cached."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpufeed.data.decode import decode, image_size
from gpufeed.demo.synth import make_image_folder


def test_writes_an_image_folder_with_varied_photo_like_jpegs(tmp_path: Path):
    root = make_image_folder(tmp_path / "d", 12, 3, seed=1)
    files = sorted(root.glob("*/*.jpg"))
    assert len(files) == 12 and sorted({f.parent.name for f in files}) == [
        "class_000",
        "class_001",
        "class_002",
    ]
    sizes = [image_size(f.read_bytes()) for f in files]
    assert all(300 <= min(s) <= 500 for s in sizes) and len({h / w for h, w in sizes}) > 6
    per_pixel = [f.stat().st_size / (h * w) for f, (h, w) in zip(files, sizes, strict=True)]
    assert 0.25 < float(np.median(per_pixel)) < 1.2  # ~50-240 KB at 400×500, like photos
    img = decode(files[0].read_bytes()).astype(float)
    assert img.std() > 20  # textured, not flat


def test_is_deterministic_and_idempotent(tmp_path: Path):
    a = make_image_folder(tmp_path / "a", 4, 2, short_side=(40, 60), seed=5)
    b = make_image_folder(tmp_path / "b", 4, 2, short_side=(40, 60), seed=5)
    fa, fb = sorted(a.glob("*/*.jpg")), sorted(b.glob("*/*.jpg"))
    assert [f.read_bytes() for f in fa] == [f.read_bytes() for f in fb]
    mtime = fa[0].stat().st_mtime_ns
    make_image_folder(tmp_path / "a", 4, 2, short_side=(40, 60), seed=5)
    assert fa[0].stat().st_mtime_ns == mtime


def test_rejects_empty_requests(tmp_path: Path):
    with pytest.raises(ValueError, match="n_images and n_classes must be >= 1"):
        make_image_folder(tmp_path, 0, 1)
