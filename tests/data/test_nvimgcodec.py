"""nvImageCodec's batched decode (`NvImageCodecDecoder`), on its CPU backend here: the pixels of
libjpeg-turbo, an undecodable image left out by position, output images reused across batches."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from gpufeed.data.dataset import ShardDataset
from gpufeed.data.decode import decode
from gpufeed.data.nvimgcodec import NvImageCodecDecoder

pytest.importorskip("nvidia.nvimgcodec")


def test_a_batch_decodes_to_the_pixels_of_libjpeg_turbo_leaving_out_what_cannot_decode(
    shards: Path,
):
    samples = list(ShardDataset(shards, shuffle=False).iter_worker(0, 1))[:6]
    data = [np.frombuffer(s.data, np.uint8) for s in samples]
    decoder = NvImageCodecDecoder(torch.device("cpu"))
    for broken in (None, 2, None):  # the images decoded into are reused from batch to batch
        batch = list(data)
        if broken is not None:
            batch[broken] = data[broken][: len(data[broken]) // 2]  # scan data ends early
        images, bad = decoder.decode_each(batch)
        assert list(bad) == ([] if broken is None else [broken])
        want = [decode(s.data) for i, s in enumerate(samples) if i != broken]
        assert len(images) == len(want)
        for got, ref in zip(images, want, strict=True):
            assert got.dtype == torch.uint8 and got.shape == ref.shape
            # both libjpeg-turbo: the same pixels (here exactly), up to rounding in another build
            assert (got.int() - torch.from_numpy(ref).int()).abs().max() <= 2
