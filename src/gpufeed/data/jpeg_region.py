"""Decode only the part of a JPEG that its crop needs: the crop box's rows and (iMCU-aligned)
columns at the DCT scale `decode` would choose, through libjpeg-turbo's partial decompression
(`_jpeg_region.c`, built when gpufeed is installed where a C compiler and libjpeg's headers
are). The pixels are those of a whole decode cropped to the box, bit for bit; rows outside the
box are still entropy-decoded and the file read to its end, so a damaged or truncated JPEG is
reported as a whole decode reports it (any JPEG this decoder refuses is decoded whole, for the
same verdict and message as without it). With `CropDecoder.fill` a whole batch goes from the
bytes to the batch slot in one native pass (`one_pass`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from gpufeed.data import one_pass
from gpufeed.data.augment import Augment, Box, crop_span
from gpufeed.data.batch import Decoder, Region, cpu_decoder
from gpufeed.data.decode import dct_scales, is_jpeg

if TYPE_CHECKING:
    import torch

try:
    from gpufeed.data import _jpeg_region
except ImportError:  # installed without a C compiler or libjpeg's headers
    _jpeg_region = None

# Columns decoded beyond the box on each side: libjpeg upsamples chroma at the edge of a cropped
# row from the edge itself, so the box's own columns are exact only with two more either side.
EDGE = 2


def available() -> bool:
    """Whether the crop-region decoder was built (else workers decode whole JPEGs)."""
    return _jpeg_region is not None


def dct_scale(size: tuple[int, int], min_size: tuple[int, int]) -> int:
    """M of the M/8 DCT scale `decode.decode` uses for an image of `size` and these minimum
    sizes: the smallest that covers them, where that is at most half size; else 8."""
    (h, w), (mh, mw) = size, min_size
    if (mh <= 0 and mw <= 0) or not dct_scales(h, w, mh, mw):
        return 8
    return next(m for m in range(1, 9) if math.ceil(h * m / 8) >= mh and math.ceil(w * m / 8) >= mw)


def decode_box(
    data: bytes, size: tuple[int, int], box: Box, min_size: tuple[int, int]
) -> np.ndarray:
    """The crop box of a JPEG of `size` (its header's) as HxWx3 uint8: exactly the pixels of a
    whole decode at `dct_scale` cropped as `augment` crops it. ValueError where libjpeg refuses
    the file or warns."""
    assert _jpeg_region is not None
    m = dct_scale(size, min_size)
    h, w = size
    scaled = (math.ceil(h * m / 8), math.ceil(w * m / 8))
    y0, y1, x0, x1 = crop_span(scaled, size, box)
    pixels = _jpeg_region.decode_region(data, m, y0, y1, x0, x1, EDGE)
    return np.frombuffer(pixels, np.uint8).reshape(y1 - y0, x1 - x0, 3)


class CropDecoder:
    """A `batch.Decoder` that decodes each JPEG's crop box only (a `Region`), and anything else,
    or a JPEG libjpeg refuses here, whole (`cpu_decoder`: the same verdict as without it). Where
    the vectorized resize runs (`one_pass_available`) it also has `fill`: the whole batch in one
    native pass over `threads` threads."""

    crops = True

    def __init__(self, threads: int = 1) -> None:
        self.threads = threads
        self.fill = self._fill if one_pass_available() else None

    def __call__(
        self,
        datas: Sequence[bytes],
        min_sizes: Sequence[tuple[int, int]],
        boxes: Sequence[Box],
        sizes: Sequence[tuple[int, int]],
    ) -> list:
        """Per image its crop box (`sizes`: the headers') as a `Region`, or a whole decode."""
        import torch

        out: list = []
        for data, min_size, box, size in zip(datas, min_sizes, boxes, sizes, strict=True):
            if is_jpeg(data):
                try:
                    image = decode_box(data, size, box, min_size)
                    out.append(Region(torch.from_numpy(image)))
                    continue
                except ValueError:
                    pass
            out.extend(cpu_decoder([data], [min_size]))
        return out

    def _fill(
        self,
        augment: Augment,
        datas: Sequence[bytes],
        sizes: Sequence[tuple[int, int]],
        boxes: Sequence[Box],
        min_sizes: Sequence[tuple[int, int]],
        flips: np.ndarray,
        out: torch.Tensor,
    ) -> list[str | None]:
        """`one_pass.fill` with this decoder's DCT scales and crop regions: each JPEG's crop box
        decoded, resized, flipped (n×2 `flips`) and written into `out`; per image None or why
        not."""
        rows = one_pass.plan(sizes, boxes, min_sizes, flips, dct_scale)
        return one_pass.fill(augment, datas, rows, out, EDGE, self.threads)


def one_pass_available() -> bool:
    """Whether batches go from bytes to the slot in one native pass here: the module is built
    and the CPU runs its vectorized resize (else torch's resize is faster)."""
    return _jpeg_region is not None and bool(_jpeg_region.FAST_RESAMPLE)


crop_decoder = CropDecoder()


def workers_decoder(asked: str, threads: int = 1) -> Decoder:
    """The CPU decoder for `Loader(decoder=asked)`: crop regions where built, unless "cpu";
    `threads` decode threads per worker for the one native pass."""
    if available() and asked != "cpu":
        return crop_decoder if threads == 1 else CropDecoder(threads)
    return cpu_decoder
