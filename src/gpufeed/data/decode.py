"""Decode image bytes on CPU: libjpeg-turbo (simplejpeg) with DCT-scaled reduced-size decoding, Pillow for the rest."""

from __future__ import annotations

import io

import numpy as np

JPEG_MAGIC = b"\xff\xd8"


class CorruptImage(ValueError):
    """The bytes are not a decodable image."""


def is_jpeg(data: bytes) -> bool:
    return data[:2] == JPEG_MAGIC


def image_size(data: bytes) -> tuple[int, int]:
    """(height, width) from the header alone; raises CorruptImage."""
    try:
        if is_jpeg(data):
            import simplejpeg

            h, w, _, _ = simplejpeg.decode_jpeg_header(data)
            return int(h), int(w)
        from PIL import Image

        with Image.open(io.BytesIO(data)) as im:
            return im.height, im.width
    except Exception as e:
        raise CorruptImage(f"unreadable image header: {e}") from e


def decode(data: bytes, min_height: int = 0, min_width: int = 0) -> np.ndarray:
    """RGB uint8 HxWx3. With min sizes, a JPEG is DCT-scaled (in steps of 1/8) to the smallest
    size that still covers them, if that is at most half size: the scales between 5/8 and 7/8
    decode slower than full size in libjpeg-turbo, so those cases decode at full size."""
    try:
        if is_jpeg(data):
            import simplejpeg

            if min_height > 0 or min_width > 0:
                h, w, _, _ = simplejpeg.decode_jpeg_header(data)
                if 2 * min_height > h or 2 * min_width > w:
                    min_height = min_width = 0
            return simplejpeg.decode_jpeg(
                data,
                colorspace="RGB",
                min_height=max(0, int(min_height)),
                min_width=max(0, int(min_width)),
            )
        from PIL import Image

        with Image.open(io.BytesIO(data)) as im:
            return np.asarray(im.convert("RGB"))
    except Exception as e:
        raise CorruptImage(f"cannot decode image: {e}") from e
