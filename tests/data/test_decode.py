"""CPU decode: libjpeg-turbo with DCT-scaled reduced-size decoding, Pillow for other formats."""

from __future__ import annotations

import io

import numpy as np
import pytest
import simplejpeg
from PIL import Image

from gpufeed.data.decode import CorruptImage, decode, image_size


@pytest.fixture
def jpeg() -> bytes:
    img = (np.random.default_rng(0).random((400, 600, 3)) * 255).astype(np.uint8)
    return simplejpeg.encode_jpeg(img, quality=90)


def test_full_decode_and_header_size(jpeg: bytes):
    assert decode(jpeg).shape == (400, 600, 3)
    assert image_size(jpeg) == (400, 600)


def test_reduced_size_decode_picks_the_smallest_dct_scale_covering_the_minimum(jpeg: bytes):
    assert decode(jpeg, 100, 100).shape == (100, 150, 3)  # 1/4
    assert decode(jpeg, 120, 120).shape == (150, 225, 3)  # 3/8: 1/4 would be too small


def test_png_goes_through_pillow():
    buf = io.BytesIO()
    Image.new("RGBA", (30, 20), (10, 20, 30, 255)).save(buf, format="PNG")
    out = decode(buf.getvalue())
    assert out.shape == (20, 30, 3) and tuple(out[0, 0]) == (10, 20, 30)


def test_garbage_and_truncated_images_raise_corrupt_image(jpeg: bytes):
    with pytest.raises(CorruptImage):
        decode(b"definitely not an image")
    with pytest.raises(CorruptImage):
        decode(jpeg[: len(jpeg) // 2])
    with pytest.raises(CorruptImage):
        image_size(b"\x00\x01")


def test_dct_scales_above_one_half_are_not_used_since_they_decode_slower(jpeg: bytes):
    assert decode(jpeg, 200, 300).shape == (200, 300, 3)  # 1/2
    assert decode(jpeg, 250, 250).shape == (400, 600, 3)  # 5/8 would cover, full size is faster
