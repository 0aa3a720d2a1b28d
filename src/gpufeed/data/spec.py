"""`BatchSpec`: the one description of a batch that every stage of the loader shares.

Workers fill host slots to it, the device stage turns slots into training batches by it, and the
memory budget is computed from it. Frozen: a stage cannot change what the others rely on.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from gpufeed.data.augment import Augment
from gpufeed.data.param_columns import Column, ParamLayout
from gpufeed.data.placement import Placement
from gpufeed.errors import OptionError

# What a worker hands over, as `Placement.handoff` says: "decoded" = uint8 N×H×W×3 images,
# augmented except normalization; "first_pass" = the same through the load block's first warp
# only, with the sampling matrices of its other warps; "encoded" = the undecoded image bytes.
HANDOFFS = ("decoded", "first_pass", "encoded")
# Who decodes for GPU preprocessing: "auto" = DALI where importable on CUDA, else nvJPEG
# (torchvision), else libjpeg-turbo on the feeder thread; "nvimgcodec" only when asked for;
# "workers" = libjpeg-turbo on the CPU workers, which also crop and resize ("first_pass").
# For "decoded" and "first_pass" slots the workers decode: "nvimgcodec" over crop boxes with
# nvImageCodec, "cpu" whole JPEGs, the others over crop boxes where `jpeg_region` was built.
DECODERS = ("auto", "dali", "nvimgcodec", "nvjpeg", "cpu", "workers")


@dataclass(frozen=True)
class BatchSpec:
    """What a batch is: its size and augmentation, how workers hand it over, what the loop gets."""

    batch_size: int
    augment: Augment
    placement: Placement  # where each stage runs; the hand-off follows from it
    dtype: Any  # torch dtype the training loop receives
    channels_last: bool
    strict: bool
    max_sample_bytes: int  # the largest encoded image, bounds "encoded" slots
    decoder: str = "auto"  # one of DECODERS
    decode_threads: int = 1  # threads per CPU worker for its one native pass (`one_pass`)

    def __post_init__(self) -> None:
        if self.decoder not in DECODERS:
            raise OptionError(f"decoder={self.decoder!r}: choose one of {', '.join(DECODERS)}")
        if not isinstance(self.placement, Placement):
            raise TypeError(f"BatchSpec placement must be a Placement, got {self.placement!r}")

    @property
    def handoff(self) -> str:
        """What a worker puts in a slot (one of HANDOFFS): the placement's hand-off."""
        return self.placement.handoff

    @property
    def host_final(self) -> bool:
        """Whether workers write the final batch (dtype, normalized, layout): a device that is
        the CPU gains nothing from uint8 and would only normalize on the loop's cores."""
        return self.placement.host_final

    @property
    def crop_regions(self) -> bool:
        """Whether the workers decode each full-size JPEG over its crop box only (nvImageCodec)."""
        return self.handoff == "decoded" and self.decoder == "nvimgcodec"

    @property
    def host_dtype(self) -> Any:
        """The dtype of "decoded" slots."""
        import torch

        return self.dtype if self.host_final else torch.uint8

    @property
    def host_shape(self) -> tuple[int, ...]:
        """The shape of one "decoded" slot: N×H×W×3 (channels_last), or N×3×H×W."""
        h, w = self.augment.size
        b = self.batch_size
        if self.host_final and not self.channels_last:
            return (b, 3, h, w)
        return (b, h, w, 3)

    @property
    def image_bytes(self) -> int:
        """Bytes of one slot's image area."""
        import torch

        h, w = self.augment.size
        if self.handoff != "encoded":
            item = torch.empty(0, dtype=self.host_dtype).element_size()
            return self.batch_size * h * w * 3 * item
        return self.batch_size * self.max_sample_bytes

    @functools.cached_property  # read per batch by workers and the device stage
    def params(self) -> ParamLayout:
        """The per-image parameters a slot carries. "encoded": each image's size and what the
        augmentation draws for it (the device stage decodes and augments); "first_pass": the
        sampling matrices of the warps after the first; "decoded": none."""
        if self.handoff == "encoded":
            return ParamLayout((Column("size", 2, "int"), *self.augment.drawn_columns()))
        if self.handoff == "first_pass":
            return ParamLayout(self.augment.later_warp_columns())
        return ParamLayout()

    @property
    def param_columns(self) -> int:
        """Float64 parameter columns per image in a slot."""
        return self.params.width

    @property
    def slot_bytes(self) -> int:
        """Host bytes of one slot: images, labels (int64), the per-image parameters (float64)
        and, for "encoded", byte offsets."""
        extra = 8 * self.batch_size * self.param_columns
        if self.handoff == "encoded":
            extra += 8 * (self.batch_size + 1)
        return self.image_bytes + 8 * self.batch_size + extra

    def output_bytes(self) -> int:
        """Device bytes of one batch as the training loop receives it."""
        import torch

        h, w = self.augment.size
        item = torch.empty(0, dtype=self.dtype).element_size()
        return self.batch_size * (3 * h * w * item + 8)
