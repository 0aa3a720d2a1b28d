"""Who decodes the device stage's batches: DALI, nvImageCodec, nvJPEG (torchvision),
libjpeg-turbo on the feeder thread, or the CPU workers; chosen from `BatchSpec.decoder` and the
device (`decoder_choice`), started (`open_decoder`: DALI that "auto" picked but that cannot start
gives way, with a warning) and named in words for `stats()` (`describe_decoder`). Asked for on
the CPU, DALI decodes with its CPU decoder and both device steps run on the feeder thread;
without DALI or CUDA the same batch is made with libjpeg-turbo on the feeder thread
(`build_batch`).

Apart from `device` so that the choice can be made and named without building a device stage.
"""

from __future__ import annotations

import warnings

import torch

from gpufeed.data import one_pass
from gpufeed.data.batch import cpu_decoder
from gpufeed.data.dali import DaliDecoder, dali_importable
from gpufeed.data.jpeg_region import one_pass_available, workers_decoder
from gpufeed.data.nvimgcodec import NvImageCodecDecoder
from gpufeed.data.spec import BatchSpec
from gpufeed.errors import GpufeedError, OptionError
from gpufeed.extras import MissingExtra, require


def nvjpeg_available() -> bool:
    """True when `torchvision.io.decode_jpeg(device="cuda")` can be used."""
    if not torch.cuda.is_available():
        return False
    try:
        require("gpu")
    except MissingExtra as e:
        if not _warned_gpu:
            _warned_gpu.append(True)
            warnings.warn(f"{e}; decoding JPEGs on the CPU instead", RuntimeWarning, stacklevel=2)
        return False
    return True


_warned_gpu: list[bool] = []  # warn once per process


def decoder_choice(spec: BatchSpec, device: torch.device) -> str:
    """Who decodes `spec`'s batches for `device`: "workers" (whole JPEGs), "workers-regions"
    (crop boxes, `jpeg_region`), "regions" (the workers, through nvImageCodec, over crop boxes), "dali", "nvimgcodec", "nvjpeg" or "cpu" (the feeder
    thread); a clear error when the decoder asked for cannot run here."""
    if spec.crop_regions:
        require("nvimgcodec")
        return "regions"
    if spec.handoff != "encoded":
        return "workers" if workers_decoder(spec.decoder) is cpu_decoder else "workers-regions"
    cuda = device.type == "cuda"
    if spec.decoder in ("dali", "nvimgcodec"):
        require(spec.decoder)
        return spec.decoder
    if spec.decoder == "nvjpeg":
        if not cuda:
            raise OptionError(
                f"decoder='nvjpeg' needs a CUDA device, not {device}: use decoder='dali' or 'cpu'"
            )
        require("gpu")
        return "nvjpeg"
    if spec.decoder == "auto" and cuda:
        if dali_importable():
            return "dali"
        if nvjpeg_available():
            return "nvjpeg"
    return "cpu"


def open_decoder(
    spec: BatchSpec, device: torch.device
) -> tuple[str, DaliDecoder | NvImageCodecDecoder | None]:
    """(decoder_choice, its started library or None). DALI that `decoder="auto"` picked but that
    cannot start on `device` (a DALI build for another CUDA than the driver's) gives way, with a
    warning, to nvJPEG or else libjpeg-turbo; a decoder asked for by name raises its clear error."""
    choice = decoder_choice(spec, device)
    try:
        if choice == "dali":
            return choice, DaliDecoder(device, spec.batch_size)
        if choice == "nvimgcodec":
            return choice, NvImageCodecDecoder(device)
    except GpufeedError as e:
        if spec.decoder != "auto":
            raise
        choice = "nvjpeg" if nvjpeg_available() else "cpu"
        warnings.warn(
            f"decoder='auto' decodes with {describe_decoder(choice, device)}, not DALI: {e}",
            RuntimeWarning,
            stacklevel=2,
        )
    return choice, None


def decoder_name(spec: BatchSpec, device: torch.device) -> str:
    """Which decoder makes `spec`'s batches for `device`, and where it runs."""
    return describe_decoder(decoder_choice(spec, device), device, spec)


def describe_decoder(choice: str, device: torch.device, spec: BatchSpec | None = None) -> str:
    """A `decoder_choice` for `device` in words: the library and where it runs (and, given the
    spec, whether the workers take its batches in one native pass, with how many threads)."""
    if choice == "workers-regions" and spec is not None and _one_pass(spec):
        name, threads = DECODER_NAMES["workers-one-pass"], spec.decode_threads
        return name if threads == 1 else f"{name[:-1]}, {threads} threads each)"
    if choice == "dali":
        return "dali (mixed)" if device.type == "cuda" else "dali (cpu)"
    if choice == "nvimgcodec":
        return "nvimgcodec (cuda)" if device.type == "cuda" else "nvimgcodec (cpu)"
    return DECODER_NAMES[choice]


def _one_pass(spec: BatchSpec) -> bool:
    """Whether CPU workers take `spec`'s batches in one native pass here."""
    return one_pass_available() and one_pass.applies(spec)


DECODER_NAMES = {
    "workers": "libjpeg-turbo (CPU workers)",
    "workers-regions": "libjpeg-turbo crop regions (CPU workers)",
    "workers-one-pass": "libjpeg-turbo crop regions, one pass to the batch (CPU workers)",
    "regions": "nvimgcodec crop regions (CPU workers)",
    "nvjpeg": "nvjpeg (torchvision)",
    "cpu": "libjpeg-turbo (feeder thread)",
}
