"""What a worker does to one batch: fill a host slot with it, as the `BatchSpec` says.

"decoded": decode (libjpeg-turbo, DCT-scaled; with decoder="nvimgcodec" a full-size JPEG over its
crop box only), crop, resize and the load block, rounded to uint8
in the slot (N×H×W×3, i.e. channels_last); normalization is left to the device stage. When the
device is the CPU (`BatchSpec.host_final`) the worker writes the final, normalized batch instead.
"first_pass": the same, but only the load block's first warp (done in the same resampling as the
crop and resize); the sampling matrices of its other warps go into the slot's parameters, for
the device stage to apply, batched, with the normalization.
"encoded": copy the image bytes into the slot back to back, for decoding on the device, with each
image's size (from its header) and its random crop box, flips and angles, so the device stage
does no per-image work on the CPU. A user transform (`Augment.transform`, on "worker") runs on
the uint8 batch before it is normalized.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from gpufeed.data.augment import Augment
from gpufeed.data.batch import batch_generator, build_batch, cpu_decoder
from gpufeed.data.dataset import RawSample
from gpufeed.data.decode import CorruptImage, image_size, is_jpeg
from gpufeed.data.plan import Position
from gpufeed.data.sample_extras import rows
from gpufeed.data.slots import Slots

if TYPE_CHECKING:
    from gpufeed.data.nvimgcodec import RegionDecoder


def fill_slot(
    samples: Sequence[RawSample],
    at: Position,
    slots: Slots,
    index: int,
    seed: int,
    rank: int,
) -> dict[str, Any]:
    """Write batch `at` into slot `index`; returns what the device stage needs besides the slot:
    `n` (samples in the slot), `corrupt` [(shard, key, reason)], if encoded `keys`, and with
    `extras=` each sample's values (`sample_extras.rows`)."""
    meta = _fill(samples, at, slots, index, seed, rank)
    if samples and samples[0].extras is not None:
        meta["extras"] = rows(samples)
    return meta


def _fill(
    samples: Sequence[RawSample], at: Position, slots: Slots, index: int, seed: int, rank: int
) -> dict[str, Any]:
    spec = slots.spec
    if spec.handoff == "encoded":
        buf, offsets = slots.images[index].numpy(), slots.offsets[index].numpy()
        pos = 0
        offsets[0] = 0
        overflow: dict[int, str] = {}
        for i, s in enumerate(samples):
            data = s.data
            if len(data) > spec.max_sample_bytes or pos + len(data) > len(buf):
                # the index understated its size: it would take another image's room
                overflow[i] = (
                    f"image of {len(data):,} bytes, more than the index bounds images to "
                    f"({spec.max_sample_bytes:,}): index the shards again (`gpufeed index`)"
                )
                data = b""
            buf[pos : pos + len(data)] = np.frombuffer(data, dtype=np.uint8)
            pos += len(data)
            offsets[i + 1] = pos
        slots.labels[index, : len(samples)] = torch.tensor([s.label for s in samples])
        bad = _encoded_params(samples, spec.augment, slots.params[index], at, seed, rank)
        return {
            "n": len(samples),
            "corrupt": [],
            "bad": bad | overflow,
            "keys": [(s.shard, s.key) for s in samples],
        }
    out = slots.images[index]
    nhwc = out.shape[-1] == 3

    def alloc(shape: tuple[int, ...]) -> torch.Tensor:
        # NCHW indexing over the slot, whichever its layout
        return out[: shape[0]].permute(0, 3, 1, 2) if nhwc else out[: shape[0]]

    aug = spec.augment
    user = aug.transform is not None and aug.transform_on == "worker"
    gen = batch_generator(seed, at.epoch, rank, at.batch)
    rest: list[torch.Tensor] | None = [] if spec.handoff == "first_pass" else None
    images, labels, corrupt = build_batch(
        samples,
        aug,
        gen,
        dtype=torch.uint8 if user else spec.host_dtype,
        channels_last=nhwc,
        strict=spec.strict,
        alloc=None if user and spec.host_dtype != torch.uint8 else alloc,
        rest=rest,
        decoder=_region_decoder() if spec.crop_regions else cpu_decoder,
    )
    if rest:  # the later warps' matrices, image by image: N × (6 per warp)
        slots.params[index, : len(labels)] = torch.cat([w.reshape(-1, 6) for w in rest], 1)
    if user:  # the user's transform on the uint8 batch, then (if the slot is final) normalize
        done = aug.worker_transform(images)
        dst = alloc(tuple(images.shape))
        if dst.dtype == torch.uint8:
            dst.copy_(done)
        else:
            aug.finish(done, [], dst)
    slots.labels[index, : len(labels)] = labels
    return {"n": len(labels), "corrupt": corrupt}


@functools.cache
def _region_decoder() -> RegionDecoder:
    """This process's crop-region decoder (made on first use, so in the worker)."""
    from gpufeed.data.nvimgcodec import RegionDecoder

    return RegionDecoder()


def _encoded_params(
    samples: Sequence[RawSample],
    aug: Augment,
    out: torch.Tensor,
    at: Position,
    seed: int,
    rank: int,
) -> dict[int, str]:
    """Fill `out` (rows: h, w, box, hflips, vflips, angles) as `build_batch` would draw them;
    returns {image: why} for images that are not decodable JPEGs (the device stage decodes those
    on the CPU, or reports them as corrupt)."""
    n = len(samples)
    sizes: list[tuple[int, int]] = []
    bad: dict[int, str] = {}
    for i, s in enumerate(samples):
        try:
            sizes.append(image_size(s.data))
            if not is_jpeg(s.data):
                bad[i] = "not a JPEG"
        except CorruptImage as e:
            sizes.append((1, 1))
            bad[i] = str(e)
    gen = batch_generator(seed, at.epoch, rank, at.batch)
    boxes = aug.boxes(sizes, gen)
    hflip, vflip, angle = aug.flips_and_angles(n, gen)
    p = out[:n].numpy()
    p[:, 0:2] = sizes
    p[:, 2:6] = boxes
    reps = hflip.shape[0]
    p[:, 6 : 6 + reps] = hflip.T.numpy()
    p[:, 6 + reps : 6 + 2 * reps] = vflip.T.numpy()
    p[:, 6 + 2 * reps : 6 + 3 * reps] = angle.T.double().numpy()
    return bad
