"""Device-side preprocessing (`Loader(preprocess="gpu")`): CPU workers only read bytes; here the
batch is decoded (nvJPEG where torchvision and CUDA exist, else libjpeg-turbo in this process)
and augmented on the target device, in a side CUDA stream so it overlaps the training step.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from gpufeed.data.augment import Augment
from gpufeed.data.batch import Decoder, batch_generator, build_batch, cpu_decoder


def nvjpeg_available() -> bool:
    """True when `torchvision.io.decode_jpeg(device="cuda")` can be used."""
    import torch

    if not torch.cuda.is_available():
        return False
    try:
        import torchvision.io  # noqa: F401
    except ImportError:
        return False
    return True


def nvjpeg_decoder(device: Any) -> Decoder:
    """Batched nvJPEG decode on `device`; non-JPEG or failing images fall back one by one."""
    import torch
    import torchvision.io as tvio

    from gpufeed.data.decode import is_jpeg

    def run(datas: Sequence[bytes], min_sizes: Sequence[tuple[int, int]]) -> list:
        out: list = [None] * len(datas)
        jpegs = [i for i, d in enumerate(datas) if is_jpeg(d)]
        tensors = [torch.frombuffer(bytearray(datas[i]), dtype=torch.uint8) for i in jpegs]
        try:
            imgs = tvio.decode_jpeg(tensors, mode=tvio.ImageReadMode.RGB, device=device)
            for i, img in zip(jpegs, imgs, strict=True):
                out[i] = img.permute(1, 2, 0)
        except RuntimeError:
            pass  # decode one by one below to find the bad image(s)
        rest = [i for i in range(len(datas)) if out[i] is None]
        for i, img in zip(
            rest, cpu_decoder([datas[i] for i in rest], [min_sizes[i] for i in rest]), strict=True
        ):
            out[i] = img if isinstance(img, Exception) else img.to(device, non_blocking=True)
        return out

    return run


@dataclass
class _Pending:
    images: Any
    labels: Any
    corrupt: list[tuple[str, str, str]]
    event: Any


class DevicePreprocessor:
    """Decode + augment raw batches on `device`; `submit` starts one, `finish` hands it over."""

    def __init__(
        self,
        augment: Augment,
        device: Any,
        *,
        dtype: Any,
        channels_last: bool,
        strict: bool,
    ) -> None:
        import torch

        self.augment, self.device = augment, torch.device(device)
        self.dtype, self.channels_last, self.strict = dtype, channels_last, strict
        self.cuda = self.device.type == "cuda"
        self.decoder: Decoder = (
            nvjpeg_decoder(self.device) if self.cuda and nvjpeg_available() else cpu_decoder
        )
        self.decoder_name = (
            "nvjpeg" if self.decoder is not cpu_decoder else "libjpeg-turbo (main process)"
        )
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None

    def submit(self, samples: Sequence[Any], meta: dict[str, Any], ds: Any) -> _Pending:
        """Start preprocessing one raw batch (asynchronously on CUDA)."""
        import torch

        gen = batch_generator(ds.seed, ds.epoch, ds.rank, meta["worker"], meta["first"])
        ctx = torch.cuda.stream(self.stream) if self.stream is not None else nullcontext()
        with ctx:
            images, labels, corrupt = build_batch(
                samples,
                self.augment,
                gen,
                dtype=self.dtype,
                channels_last=self.channels_last,
                strict=self.strict,
                decoder=self.decoder,
                device=self.device,
            )
            labels = labels.to(self.device, non_blocking=True)
            event = None
            if self.stream is not None:
                event = torch.cuda.Event()
                event.record(self.stream)
        return _Pending(images, labels, corrupt, event)

    def finish(self, p: _Pending) -> tuple[Any, Any]:
        """Make the current stream wait for the batch, and return it."""
        import torch

        if p.event is not None:
            torch.cuda.current_stream(self.device).wait_event(p.event)
            p.images.record_stream(torch.cuda.current_stream(self.device))
            p.labels.record_stream(torch.cuda.current_stream(self.device))
        return p.images, p.labels
