"""What a worker does to one batch: run the stages its `Placement` gives the workers, into a host
slot, and say what it did in a `SlotMeta`.

"decoded": decode (libjpeg-turbo, DCT-scaled; with decoder="nvimgcodec" a full-size JPEG over its
crop box only), crop, resize and the load block, rounded to uint8 (N×H×W×3), or normalized too
where the placement says so. "first_pass": the same up to the load block's first warp; the other
warps' matrices go into the slot's `warps` column. "encoded": the image bytes back to back, with
each image's size and the parameters the augmentation draws, in the columns it declares. A user
transform (`Augment.transform`, on "worker") runs on the uint8 batch before it is normalized.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from gpufeed.data.batch import batch_generator, build_batch
from gpufeed.data.dataset import RawSample
from gpufeed.data.decode import CorruptImage, image_size, is_jpeg
from gpufeed.data.jpeg_region import workers_decoder
from gpufeed.data.plan import Position
from gpufeed.data.sample_extras import rows
from gpufeed.data.slot_meta import SlotMeta
from gpufeed.data.slots import Slots

if TYPE_CHECKING:
    from gpufeed.data.nvimgcodec import RegionDecoder
    from gpufeed.data.spec import BatchSpec


def fill_slot(
    samples: Sequence[RawSample],
    at: Position,
    slots: Slots,
    index: int,
    seed: int,
    rank: int,
) -> SlotMeta:
    """Write batch `at` into slot `index`; returns what the device stage needs besides the slot."""
    meta = _fill(samples, at, slots, index, seed, rank)
    if samples and samples[0].extras is not None:
        return dataclasses.replace(meta, extras=tuple(rows(samples)))
    return meta


def _fill(
    samples: Sequence[RawSample], at: Position, slots: Slots, index: int, seed: int, rank: int
) -> SlotMeta:
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
        bad = _encoded_params(samples, spec, slots.params[index], at, seed, rank)
        keys = tuple((s.shard, s.key) for s in samples)
        return SlotMeta(len(samples), keys=keys, bad=bad | overflow)
    out = slots.images[index]
    nhwc = out.shape[-1] == 3

    def alloc(shape: tuple[int, ...]) -> torch.Tensor:
        # NCHW indexing over the slot, whichever its layout
        return out[: shape[0]].permute(0, 3, 1, 2) if nhwc else out[: shape[0]]

    aug = spec.augment
    user = aug.transform is not None and aug.transform_on == "worker"
    gen = batch_generator(seed, at.epoch, rank, at.batch)
    decoder = (
        _region_decoder()
        if spec.crop_regions
        else workers_decoder(spec.decoder, spec.decode_threads)
    )
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
        decoder=decoder,
    )
    if rest:  # the later warps' matrices, image by image: N × (6 per warp)
        warps = torch.cat([w.reshape(-1, 6) for w in rest], 1)
        spec.params.pack(slots.params[index].numpy(), {"warps": warps.numpy()})
    if user:  # the user's transform on the uint8 batch, then (if the slot is final) normalize
        done = aug.worker_transform(images)
        dst = alloc(tuple(images.shape))
        if dst.dtype == torch.uint8:
            dst.copy_(done)
        else:
            aug.finish(done, [], dst)
    slots.labels[index, : len(labels)] = labels
    return SlotMeta(len(labels), corrupt=tuple(corrupt))


@functools.cache
def _region_decoder() -> RegionDecoder:
    """This process's crop-region decoder (made on first use, so in the worker)."""
    from gpufeed.data.nvimgcodec import RegionDecoder

    return RegionDecoder()


def _encoded_params(
    samples: Sequence[RawSample],
    spec: BatchSpec,
    out: torch.Tensor,
    at: Position,
    seed: int,
    rank: int,
) -> dict[int, str]:
    """Fill `out` with each image's size and the parameters `build_batch` would draw for it;
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
    aug = spec.augment
    boxes = aug.boxes(sizes, gen)
    hflip, vflip, angle = aug.flips_and_angles(n, gen)
    drawn = {"box": boxes, "hflip": hflip.T, "vflip": vflip.T, "angle": angle.T.double()}
    spec.params.pack(out.numpy(), {"size": sizes, **drawn})
    return bad
