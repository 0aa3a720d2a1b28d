"""NVIDIA nvImageCodec as the device stage's JPEG decoder (`Loader(decoder="nvimgcodec")`).

The library under DALI's decoders, without a pipeline: one batched `Decoder.decode` call on the
stage's CUDA stream (hardware JPEG decoder where the GPU has one, else CUDA / hybrid), whose
output images are reused from batch to batch (so their device buffers are not allocated again
for every batch) and read by torch in place (`__cuda_array_interface__`). An image it cannot
decode comes back as None: the others stay in the batch (a truncated JPEG, which libjpeg-turbo
refuses, may decode on the GPU, gray where its data ends). On a CPU device it decodes on the CPU.

`RegionDecoder` is the CPU workers' decoder with CPU preprocessing: libjpeg-turbo through
nvImageCodec's CPU backend, which can decode a region of a JPEG without the rest.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from gpufeed.errors import GpufeedError
from gpufeed.extras import require


class NvImageCodecDecoder:
    """Batched decode of encoded images to uint8 H×W×3 tensors on `device`."""

    def __init__(self, device: torch.device) -> None:
        nic = require("nvimgcodec")
        self.device, self.nic = device, nic
        if device.type == "cuda":
            index = torch.cuda.current_device() if device.index is None else device.index
            options: dict[str, Any] = {"device_id": index}
        else:
            options = {
                "device_id": nic.NVIMGCODEC_DEVICE_CPU_ONLY,
                "backends": [nic.Backend(nic.BackendKind.CPU_ONLY)],
            }
        try:
            self.decoder = nic.Decoder(**options)
        except RuntimeError as e:
            raise GpufeedError(
                f"nvImageCodec cannot decode on {device} ({e}): install the build for your CUDA "
                "(nvidia-nvimgcodec-cu13 or -cu12), or pass Loader(decoder='nvjpeg') or 'cpu'"
            ) from None
        self.params = nic.DecodeParams(
            color_spec=nic.ColorSpec.SRGB,
            apply_exif_orientation=False,  # as the other decoders: the header's size holds
        )
        self._reuse: list[Any] = []  # the last batch's output images, decoded into again

    def decode_each(
        self, data: Sequence[np.ndarray], stream: Any = None
    ) -> tuple[list[torch.Tensor], dict[int, str]]:
        """(uint8 H×W×3 images of those that decode, in order; {image: why} of the others).
        On CUDA the images are ready in `stream`'s order and valid until the next call."""
        if not data:
            return [], {}
        kw: dict[str, Any] = {"params": self.params}
        if stream is not None:
            kw["cuda_stream"] = int(stream.cuda_stream)
        if len(self._reuse) >= len(data):
            kw["images"] = self._reuse[: len(data)]
        out = self.decoder.decode([bytes(d) for d in data], **kw)
        bad = {i: _why_not(data[i]) for i, im in enumerate(out) if im is None}
        good = [im for im in out if im is not None]
        if not bad and len(out) > len(self._reuse):
            self._reuse = list(out)
        if self.device.type == "cuda":
            return [torch.as_tensor(im, device=self.device) for im in good], bad
        return [torch.from_numpy(np.asarray(im.cpu())) for im in good], bad


def _why_not(data: np.ndarray) -> str:
    """Why nvImageCodec gave no image for `data`, in libjpeg-turbo's words (nvImageCodec's own log
    is quiet: see `gpufeed.extras.QUIET_IMPORT`)."""
    from gpufeed.data.batch import cpu_decoder

    got = cpu_decoder([bytes(data)], [(0, 0)])[0]
    if isinstance(got, Exception):
        return f"{got} (nvImageCodec)"
    return "cannot decode image with nvImageCodec (libjpeg-turbo can: try Loader(decoder='cpu'))"


class RegionDecoder:
    """The CPU workers' decoder with `Loader(preprocess="cpu", decoder="nvimgcodec")`: a JPEG that
    would be decoded at full size is decoded over its crop box only, by nvImageCodec's CPU
    backend (libjpeg-turbo). The pixels are those of a full decode, cropped; the CPU time is that
    of the box's rows and columns (benchmarks/loader_throughput.py). JPEGs that DCT-scale, that do
    not end with their end-of-image marker (a file cut short), other formats and images it cannot
    decode go through `cpu_decoder`, which says why they fail. nvImageCodec reports none of
    libjpeg's warnings: damage inside the scan data can decode (garbled) without a report."""

    crops = True  # build_batch hands it the crop boxes

    def __init__(self) -> None:
        self._pid = -1  # a decoder made before a fork is not used after it
        self._decoder: Any = None
        self._params: Any = None

    def _library(self) -> tuple[Any, Any]:
        nic = require("nvimgcodec")
        if self._pid != os.getpid():
            self._decoder = nic.Decoder(
                device_id=nic.NVIMGCODEC_DEVICE_CPU_ONLY,
                backends=[nic.Backend(nic.BackendKind.CPU_ONLY)],
                max_num_cpu_threads=1,  # the workers are the parallelism
            )
            self._params = nic.DecodeParams(
                color_spec=nic.ColorSpec.SRGB, apply_exif_orientation=False
            )
            self._pid = os.getpid()
        return nic, self._decoder

    def __call__(
        self,
        datas: Sequence[bytes],
        min_sizes: Sequence[tuple[int, int]],
        boxes: Sequence[tuple[int, int, int, int]],
        sizes: Sequence[tuple[int, int]],
    ) -> list:
        """Per image (`sizes`: the headers'): a `Region` (its box), an H×W×3 uint8 tensor or an
        Exception."""
        from gpufeed.data.batch import Region, cpu_decoder
        from gpufeed.data.decode import JPEG_END, dct_scales, is_jpeg

        nic, decoder = self._library()
        out: list = [None] * len(datas)
        regions, where = [], []
        for i, (data, (mh, mw), (y, x, h, w), (ih, iw)) in enumerate(
            zip(datas, min_sizes, boxes, sizes, strict=True)
        ):
            full_size = is_jpeg(data) and not dct_scales(ih, iw, mh, mw)
            if full_size and bytes(data[-2:]) == JPEG_END:
                stream = nic.CodeStream(bytes(data))
                regions.append(stream.get_sub_code_stream(region=nic.Region(y, x, y + h, x + w)))
                where.append(i)
        if regions:
            for i, im in zip(where, decoder.decode(regions, params=self._params), strict=True):
                if im is not None:
                    out[i] = Region(torch.from_numpy(np.asarray(im.cpu())))
        rest = [i for i in range(len(datas)) if out[i] is None]
        for i, img in zip(
            rest, cpu_decoder([datas[i] for i in rest], [min_sizes[i] for i in rest]), strict=True
        ):
            out[i] = img
        return out
