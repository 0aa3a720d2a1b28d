"""Decoding only a crop's rows and columns gives the pixels of a whole decode cropped the same
way, bit for bit, for every JPEG layout and DCT scale; a damaged or truncated JPEG gets the
verdict and message of a whole decode; a Loader with it makes the batches of one without."""

from __future__ import annotations

import io
import os
import random

import numpy as np
import pytest
import torch
from jpegs import jpeg, photo
from PIL import Image

from gpufeed.data import jpeg_region
from gpufeed.data.augment import Augment, crop_span
from gpufeed.data.batch import Region, cpu_decoder
from gpufeed.data.decode import CorruptImage, decode, image_size
from gpufeed.data.loader import Loader

if not jpeg_region.available():
    if os.environ.get("CI"):  # the CI machine has a compiler and libjpeg's headers: it must build
        pytest.fail("gpufeed.data._jpeg_region was not built", pytrace=False)
    pytest.skip("gpufeed was installed without its crop-region decoder", allow_module_level=True)


LAYOUTS = {
    "4:2:0": {"subsampling": 2},
    "4:2:2": {"subsampling": 1},
    "4:4:4": {"subsampling": 0},
    "progressive": {"subsampling": 2, "progressive": True},
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("min_size", [(0, 0), (40, 40), (90, 90), (150, 200)])
def test_a_crop_region_is_the_crop_of_a_whole_decode(layout: str, min_size: tuple[int, int]):
    data = jpeg(**LAYOUTS[layout])
    size = image_size(data)
    whole = decode(data, *min_size)  # the DCT scale `decode` picks for these minimum sizes
    rng = random.Random(hash((layout, min_size)))
    for _ in range(40):
        bh, bw = rng.randint(1, size[0]), rng.randint(1, size[1])
        box = (rng.randint(0, size[0] - bh), rng.randint(0, size[1] - bw), bh, bw)
        y0, y1, x0, x1 = crop_span(whole.shape[:2], size, box)
        got = jpeg_region.decode_box(data, size, box, min_size)
        assert np.array_equal(got, whole[y0:y1, x0:x1]), box


def test_a_grayscale_jpeg_gives_rgb_like_a_whole_decode():
    buf = io.BytesIO()
    Image.fromarray(photo(120, 160, 1)[..., 0]).save(buf, "JPEG", quality=90)
    data, box = buf.getvalue(), (10, 20, 70, 90)
    y0, y1, x0, x1 = crop_span((120, 160), (120, 160), box)
    got = jpeg_region.decode_box(data, (120, 160), box, (0, 0))
    assert got.shape == (70, 90, 3) and np.array_equal(got, decode(data)[y0:y1, x0:x1])


def _verdicts(data: bytes, box: tuple[int, int, int, int]) -> tuple[object, object]:
    """What the crop decoder and the whole-image decoder make of `data` for `box`."""
    region = jpeg_region.crop_decoder([data], [(0, 0)], [box], [image_size(data)])[0]
    whole = cpu_decoder([data], [(0, 0)])[0]
    return region, whole


@pytest.mark.parametrize("box", [(0, 0, 40, 60), (120, 100, 100, 200)])
def test_a_truncated_jpeg_is_corrupt_with_the_message_of_a_whole_decode(box):
    data = jpeg()
    region, whole = _verdicts(data[: len(data) * 2 // 3], box)  # cut below the top crop's rows
    assert isinstance(region, CorruptImage) and isinstance(whole, CorruptImage)
    assert str(region) == str(whole)


def test_damage_below_the_crop_is_reported_as_a_whole_decode_reports_it():
    data = bytearray(jpeg(seed=3))
    data[len(data) - 300 : len(data) - 290] = b"\xff\x00" * 5  # garbage in the last rows' data
    region, whole = _verdicts(bytes(data), (0, 0, 30, 30))
    assert isinstance(whole, CorruptImage) and isinstance(region, CorruptImage)
    assert str(region) == str(whole)


def test_a_cmyk_jpeg_gets_the_whole_decoders_verdict():
    buf = io.BytesIO()
    Image.fromarray(photo(64, 64, 2)).convert("CMYK").save(buf, "JPEG")
    region, whole = _verdicts(buf.getvalue(), (0, 0, 32, 32))
    assert type(region) is type(whole)
    assert not isinstance(region, Region)


def test_other_formats_are_decoded_whole():
    buf = io.BytesIO()
    Image.fromarray(photo(40, 50, 4)).save(buf, "PNG")
    (out,) = jpeg_region.crop_decoder([buf.getvalue()], [(0, 0)], [(0, 0, 20, 20)], [(40, 50)])
    assert isinstance(out, torch.Tensor) and out.shape == (40, 50, 3)


@pytest.mark.parametrize("load", [1, 3])
def test_a_loader_decoding_crop_regions_makes_the_batches_of_one_decoding_whole_jpegs(
    shards, load: int
):
    aug = Augment.load_factor(load, size=(48, 48))
    out = {}
    for decoder in ("auto", "cpu"):
        with Loader(shards, 8, num_workers=2, augment=aug, decoder=decoder, seed=3) as loader:
            out[decoder] = [(x, y.tolist()) for x, y in loader]
            assert loader.stats()["decoder"] == (
                "libjpeg-turbo crop regions (CPU workers)"  # rotations: not one pass
                if decoder == "auto"
                else "libjpeg-turbo (CPU workers)"
            )
    assert len(out["auto"]) == len(out["cpu"]) > 0
    for (xa, ya), (xc, yc) in zip(out["auto"], out["cpu"], strict=True):
        assert ya == yc and torch.equal(xa, xc)
