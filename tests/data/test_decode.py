"""CPU decode: libjpeg-turbo with DCT-scaled reduced-size decoding, Pillow for other formats."""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest
import simplejpeg
from bombs import jpeg_claiming
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
    assert out.flags.writeable  # as libjpeg-turbo's: torch.from_numpy takes it without a warning


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


# --- decompression bombs ------------------------------------------------------------------------


def png_claiming(height: int, width: int) -> bytes:
    """A small valid PNG whose IHDR is patched (CRC fixed) to claim height × width pixels."""
    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, format="PNG")
    data = bytearray(buf.getvalue())
    assert data[12:16] == b"IHDR"
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


_BOMB_CHILD = """
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # a regression fails, not swaps
from gpufeed.data.decode import decode, image_size
data = open(sys.argv[1], "rb").read()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
reasons = []
for call in (lambda: decode(data), lambda: decode(data, 100, 100), lambda: image_size(data)):
    try:
        call()
        reasons.append(None)
    except Exception as e:
        reasons.append(f"{type(e).__name__}: {e}")
seconds = time.perf_counter() - t
grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({"reasons": reasons, "seconds": seconds, "rss_growth_kb": grew}))
"""


def test_a_jpeg_bomb_is_rejected_from_its_header_before_anything_is_allocated(tmp_path):
    bomb = jpeg_claiming(60000, 60000)
    assert len(bomb) < 2500 and simplejpeg.decode_jpeg_header(bomb)[:2] == (60000, 60000)
    (tmp_path / "bomb.jpg").write_bytes(bomb)
    out = subprocess.run(
        [sys.executable, "-c", _BOMB_CHILD, str(tmp_path / "bomb.jpg")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    got = json.loads(out.stdout)
    for reason in got["reasons"]:  # decode, DCT-scaled decode and image_size all refuse it
        assert reason == (
            "CorruptImage: image claims 60000×60000 pixels, over the limit of 178,956,970 (a "
            "possible decompression bomb); raise gpufeed.data.decode.MAX_IMAGE_PIXELS to allow it"
        )
    assert got["rss_growth_kb"] < 20_000 and got["seconds"] < 1.0


def test_the_pixel_limit_is_configurable(jpeg: bytes, monkeypatch: pytest.MonkeyPatch):
    from gpufeed.data import decode as decode_module

    monkeypatch.setattr(decode_module, "MAX_IMAGE_PIXELS", 400 * 600 - 1)
    with pytest.raises(CorruptImage, match=r"claims 600×400 pixels, over the limit of 239,999"):
        decode(jpeg, 100, 100)
    with pytest.raises(CorruptImage, match="MAX_IMAGE_PIXELS"):
        image_size(jpeg)
    monkeypatch.setattr(decode_module, "MAX_IMAGE_PIXELS", 400 * 600)
    assert decode(jpeg).shape == (400, 600, 3)
    monkeypatch.setattr(decode_module, "MAX_IMAGE_PIXELS", None)
    assert image_size(jpeg_claiming(60000, 60000)) == (60000, 60000)  # header only: harmless


def test_other_formats_are_checked_too_and_pillows_bomb_error_is_a_clear_corrupt_image(
    monkeypatch: pytest.MonkeyPatch,
):
    from gpufeed.data import decode as decode_module

    bomb = png_claiming(60000, 60000)
    for call in (decode, image_size):
        with pytest.raises(CorruptImage, match=r"over Pillow's size limit.*PIL\.Image\.MAX_IMAGE"):
            call(bomb)
    monkeypatch.setattr(decode_module, "MAX_IMAGE_PIXELS", 1000)
    with pytest.raises(CorruptImage, match=r"claims 40×30 pixels, over the limit of 1,000"):
        decode(png_claiming(30, 40))
