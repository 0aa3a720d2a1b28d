"""Decode image bytes on CPU: libjpeg-turbo (simplejpeg) with DCT-scaled reduced-size decoding, Pillow for the rest.

Decompression bombs: an image header can claim any size (a 600-byte JPEG can claim 60000×60000,
which is 10 GB of RGB pixels), so every decode checks the size its header claims before
decoding. An image of more than `MAX_IMAGE_PIXELS` pixels (height × width) is a `CorruptImage`
(skipped and reported by the loader, like any undecodable image), and `image_size` reports it too,
so callers that read headers first reject it before any decoding. The default is Pillow's hard
limit (twice `PIL.Image.MAX_IMAGE_PIXELS`, about 179 million pixels, 537 MB as RGB). To allow
larger images set `gpufeed.data.decode.MAX_IMAGE_PIXELS` (an int, or None for no limit) before the
loader starts its workers (they are forked and inherit it). Formats other than JPEG also go
through Pillow's own check, which `PIL.Image.MAX_IMAGE_PIXELS` controls (Pillow refuses images
over twice that value and warns over it); its refusal is a `CorruptImage` too.
"""

from __future__ import annotations

import io
import re
from typing import TYPE_CHECKING

import numpy as np

from gpufeed.errors import GpufeedError

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

JPEG_MAGIC = b"\xff\xd8"
JPEG_END = b"\xff\xd9"  # the end-of-image marker: a file cut short lacks it
MAX_IMAGE_PIXELS: int | None = 178_956_970


class CorruptImage(GpufeedError, ValueError):
    """The bytes are not a decodable image (or claim more pixels than `MAX_IMAGE_PIXELS`)."""


def is_jpeg(data: bytes) -> bool:
    return data[:2] == JPEG_MAGIC


def check_pixels(height: int, width: int) -> None:
    """Raise CorruptImage when a header's claimed size is over `MAX_IMAGE_PIXELS`."""
    limit = MAX_IMAGE_PIXELS
    if limit is not None and height * width > limit:
        raise CorruptImage(
            f"image claims {width}×{height} pixels, over the limit of {limit:,} "
            "(a possible decompression bomb); raise gpufeed.data.decode.MAX_IMAGE_PIXELS to allow it"
        )


_OBJECT_REPR = re.compile(r"\s*<[\w.]+ object at 0x[0-9a-fA-F]+>")


def error_reason(exc: BaseException) -> str:
    """A one-line reason for a failed decode, without the in-memory file objects Pillow names
    (`cannot identify image file <_io.BytesIO object at 0x...>`)."""
    text = _OBJECT_REPR.sub("", str(exc)).strip() or type(exc).__name__
    return " ".join(text.split())


def to_rgb(im: PILImage) -> np.ndarray:
    """RGB uint8 HxWx3 from any Pillow image; 16- and 32-bit integer images are scaled to
    8 bits (Pillow's own convert clips them: 40000/65535 would become 255)."""
    if im.mode.startswith("I"):
        a = np.asarray(im)
        top = 65535 if im.mode.startswith("I;16") or a.max(initial=0) <= 65535 else a.max()
        a8 = (np.clip(a, 0, None).astype(np.float64) * (255 / top) + 0.5).astype(np.uint8)
        return np.ascontiguousarray(np.repeat(a8[..., None], 3, axis=2))
    return np.array(im.convert("RGB"))  # a writable copy: torch warns on a read-only array


def _pillow_open(data: bytes) -> PILImage:
    """Open (header only) with Pillow; a size over either limit is a CorruptImage."""
    from PIL import Image

    try:
        im = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as e:
        raise CorruptImage(
            f"image is over Pillow's size limit ({e}); raise PIL.Image.MAX_IMAGE_PIXELS "
            "and gpufeed.data.decode.MAX_IMAGE_PIXELS to allow it"
        ) from None
    try:
        check_pixels(im.height, im.width)
    except CorruptImage:
        im.close()
        raise
    return im


def image_size(data: bytes) -> tuple[int, int]:
    """(height, width) from the header alone; raises CorruptImage, also for an image over
    `MAX_IMAGE_PIXELS`."""
    try:
        if is_jpeg(data):
            import simplejpeg

            h, w, _, _ = simplejpeg.decode_jpeg_header(data)
            check_pixels(int(h), int(w))
            return int(h), int(w)
        with _pillow_open(data) as im:
            return im.height, im.width
    except CorruptImage:
        raise
    except Exception as e:
        raise CorruptImage(f"unreadable image header: {error_reason(e)}") from e


def dct_scales(height: int, width: int, min_height: int, min_width: int) -> bool:
    """Whether `decode` DCT-scales a height×width JPEG for these minimum sizes."""
    return 2 * min_height <= height and 2 * min_width <= width


def decode(data: bytes, min_height: int = 0, min_width: int = 0) -> np.ndarray:
    """RGB uint8 HxWx3. With min sizes, a JPEG is DCT-scaled (in steps of 1/8) to the smallest
    size that still covers them, if that is at most half size: the scales between 5/8 and 7/8
    decode slower than full size in libjpeg-turbo, so those cases decode at full size.

    The header's size is checked against `MAX_IMAGE_PIXELS` before anything is decoded."""
    try:
        if is_jpeg(data):
            import simplejpeg

            h, w, _, _ = simplejpeg.decode_jpeg_header(data)
            check_pixels(int(h), int(w))
            if not dct_scales(int(h), int(w), min_height, min_width):
                min_height = min_width = 0
            return simplejpeg.decode_jpeg(
                data,
                colorspace="RGB",
                min_height=max(0, int(min_height)),
                min_width=max(0, int(min_width)),
            )
        with _pillow_open(data) as im:
            return to_rgb(im)
    except CorruptImage:
        raise
    except Exception as e:
        raise CorruptImage(f"cannot decode image: {error_reason(e)}") from e
