"""NVIDIA DALI as the device stage's JPEG decoder (`Loader(decoder="dali")`).

The workers' encoded slots are fed to a DALI pipeline through `fn.external_source`; its image
decoder ("mixed" on CUDA: the hardware JPEG decoder where the GPU has one, nvJPEG otherwise, with
DALI's own memory pools and streams, so no device-wide cudaMalloc/cudaFree sync beside training;
"cpu" when the target device is the CPU) decodes the batch, and `fn.pad` lays it out as one
zero-padded uint8 N×H×W×3 canvas that is copied into a torch tensor on the stage's stream, with
no trip through host memory.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from gpufeed.cores import usable_cores
from gpufeed.errors import GpufeedError
from gpufeed.extras import require


def dali_importable() -> bool:
    """True when `nvidia.dali` is installed (without importing it: that takes ~0.5 s)."""
    try:
        return importlib.util.find_spec("nvidia.dali") is not None
    except (ImportError, ValueError, AttributeError):
        return False


class DaliDecoder:
    """A DALI pipeline decoding batches of up to `batch_size` encoded images on `device`."""

    def __init__(self, device: torch.device, batch_size: int, threads: int | None = None) -> None:
        require("dali")  # a clear error naming the extra when DALI is missing
        self.device, self.batch_size = device, batch_size
        self.threads = threads or max(1, min(4, usable_cores()))
        try:
            self.pipe = self._build()
        except RuntimeError as e:  # e.g. a DALI build for another CUDA than the driver's
            raise GpufeedError(
                f"NVIDIA DALI cannot decode on {device} ({_last_line(e)}): install the DALI "
                "build for your CUDA (nvidia-dali-cuda130 or -cuda120), or pass "
                "Loader(decoder='nvjpeg') or decoder='cpu'"
            ) from None

    def _build(self) -> Any:
        from nvidia.dali import fn, types
        from nvidia.dali.pipeline import Pipeline

        cuda = self.device.type == "cuda"
        device_id = None
        if cuda:
            index = self.device.index
            device_id = torch.cuda.current_device() if index is None else index
        pipe = Pipeline(
            batch_size=self.batch_size,
            num_threads=self.threads,
            device_id=device_id,
            prefetch_queue_depth=1,
        )
        with pipe:
            data = fn.external_source(name="jpeg", dtype=types.UINT8, ndim=1)
            images = fn.decoders.image(
                data,
                device="mixed" if cuda else "cpu",
                output_type=types.RGB,
                adjust_orientation=False,  # as the other decoders: the header's size holds
            )
            # zero padding at the bottom and right, to the batch's largest image
            pipe.set_outputs(fn.pad(images, axes=(0, 1), fill_value=0))
        pipe.build()
        return pipe

    def decode(self, data: Sequence[np.ndarray], stream: Any = None) -> torch.Tensor:
        """uint8 N×H×W×3 on the device (image k in the top-left corner of row k, zeros around
        it), copied on `stream`; raises RuntimeError when an image cannot be decoded (the
        pipeline is rebuilt, ready for the next batch)."""
        try:
            self.pipe.feed_input("jpeg", list(data))
            (out,) = self.pipe.run()
            dense = out.as_tensor()
        except RuntimeError:
            self.pipe = self._build()  # a failed DALI pipeline cannot run again
            raise
        from nvidia.dali.plugin.pytorch import feed_ndarray

        x = torch.empty(dense.shape(), dtype=torch.uint8, device=self.device)
        feed_ndarray(dense, x, cuda_stream=stream)
        return x

    def decode_each(
        self, data: Sequence[np.ndarray], stream: Any = None
    ) -> tuple[torch.Tensor | None, dict[int, str]]:
        """`decode`, leaving out the images DALI cannot decode: (the canvas of the others, or
        None if none is left; {image: why} of those left out). One by one only after a failure."""
        if not data:
            return None, {}
        try:
            return self.decode(data, stream), {}
        except RuntimeError:
            pass
        bad: dict[int, str] = {}
        for i, d in enumerate(data):
            try:
                self.decode([d], stream)
            except RuntimeError as e:
                bad[i] = f"cannot decode image: {_last_line(e)}"
        good = [d for i, d in enumerate(data) if i not in bad]
        return (self.decode(good, stream) if good else None), bad


def _last_line(error: BaseException) -> str:
    """DALI's errors span many lines (a pipeline traceback): the one that says what failed."""
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    if "encountered:" in lines[:-1]:
        return lines[lines.index("encountered:") + 1][:200]
    return (lines or [type(error).__name__])[-1][:200]
