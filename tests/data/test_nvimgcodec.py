"""nvImageCodec's batched decode (`NvImageCodecDecoder`), on its CPU backend here: the pixels of
libjpeg-turbo, an undecodable image left out by position, output images reused across batches.
And the CPU workers' decode over each image's crop box (`RegionDecoder`): the pixels, batches and
corrupt-sample reports of full decodes."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from loader_helpers import workers_decoder_name
from PIL import Image

from gpufeed.data.augment import Augment
from gpufeed.data.batch import Region
from gpufeed.data.dataset import ShardDataset
from gpufeed.data.decode import CorruptImage, decode
from gpufeed.data.loader import Loader
from gpufeed.data.nvimgcodec import NvImageCodecDecoder, RegionDecoder
from gpufeed.extras import MissingExtra

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
        # why, in libjpeg-turbo's words: nvImageCodec's own log is quiet
        assert all(why.startswith("cannot decode image: ") for why in bad.values())
        want = [decode(s.data) for i, s in enumerate(samples) if i != broken]
        assert len(images) == len(want)
        for got, ref in zip(images, want, strict=True):
            assert got.dtype == torch.uint8 and got.shape == ref.shape
            # both libjpeg-turbo: the same pixels (here exactly), up to rounding in another build
            assert (got.int() - torch.from_numpy(ref).int()).abs().max() <= 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_batch_decodes_on_cuda_in_the_stream_order_to_the_pixels_of_libjpeg_turbo(shards: Path):
    samples = list(ShardDataset(shards, shuffle=False).iter_worker(0, 1))[:6]
    data = [np.frombuffer(s.data, np.uint8) for s in samples]
    decoder = NvImageCodecDecoder(torch.device("cuda"))
    stream = torch.cuda.Stream()
    for broken in (None, 3, None):  # the device buffers are reused from batch to batch
        batch = list(data)
        if broken is not None:  # not a JPEG (a truncated one decodes on the GPU, gray below)
            batch[broken] = np.frombuffer(b"not an image " * 8, np.uint8)
        with torch.cuda.stream(stream):
            images, bad = decoder.decode_each(batch, stream)
            got = [im.cpu() for im in images]  # read in the stream the decode ran in
        assert list(bad) == ([] if broken is None else [broken])
        want = [decode(s.data) for i, s in enumerate(samples) if i != broken]
        assert len(images) == len(want) and all(im.is_cuda for im in images)
        for g, ref in zip(got, want, strict=True):
            assert g.dtype == torch.uint8 and g.shape == ref.shape
            diff = (g.int() - torch.from_numpy(ref).int()).abs().float()
            assert diff.mean() < 2.0  # another IDCT and chroma upsampling: close, not equal


# --- RegionDecoder: the CPU workers' decode over the crop box (Loader(decoder="nvimgcodec")) ---


def test_a_full_size_jpeg_is_decoded_over_its_crop_box_only_with_the_pixels_of_a_full_decode(
    shards: Path,
):
    samples = list(ShardDataset(shards, shuffle=False).iter_worker(0, 1))[:8]
    full = [decode(s.data) for s in samples]
    boxes = [(3, 5, f.shape[0] - 9, f.shape[1] - 7) for f in full]
    big = [(f.shape[0], f.shape[1]) for f in full]  # min sizes no DCT scale can reach
    got = RegionDecoder()([s.data for s in samples], big, boxes, big)
    for img, f, (y, x, h, w) in zip(got, full, boxes, strict=True):
        assert isinstance(img, Region) and img.image.dtype == torch.uint8
        assert torch.equal(img.image, torch.from_numpy(f[y : y + h, x : x + w]))


def test_what_it_cannot_decode_over_a_box_goes_to_libjpeg_turbo_which_says_why(
    shards: Path, tmp_path: Path
):
    data = next(iter(ShardDataset(shards, shuffle=False).iter_worker(0, 1))).data
    h, w = decode(data).shape[:2]
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (10, 200, 30)).save(buf, format="PNG")
    datas = [data, data[: len(data) // 2], buf.getvalue()]
    mins = [(1, 1), (h, w), (h, w)]  # the first DCT-scales to 1/8: no box for that one
    box = (0, 0, h, w)
    scaled, truncated, png = RegionDecoder()(datas, mins, [box] * 3, [(h, w)] * 3)
    assert torch.equal(scaled, torch.from_numpy(decode(data, 1, 1)))
    assert isinstance(truncated, CorruptImage) and "cannot decode image" in str(truncated)
    assert torch.equal(png, torch.from_numpy(decode(buf.getvalue())))


def test_a_jpeg_cut_short_goes_to_libjpeg_turbo_even_where_its_box_lies_in_what_remains():
    """nvImageCodec reports none of libjpeg's warnings: a cut file would decode over a box in its
    first rows, unreported. One that does not end with its end-of-image marker is not sent."""
    import simplejpeg

    rows = np.linspace(0, 255, 375, dtype=np.uint8)[:, None, None]
    cols = np.linspace(0, 255, 500, dtype=np.uint8)[None, :, None]
    photo = np.ascontiguousarray(np.broadcast_to((rows // 2 + cols // 2), (375, 500, 3)))
    data = simplejpeg.encode_jpeg(photo, quality=90)
    cut = data[: len(data) * 9 // 10]
    got = RegionDecoder()([data, cut], [(375, 500)] * 2, [(0, 0, 64, 64)] * 2, [(375, 500)] * 2)
    assert isinstance(got[0], Region) and isinstance(got[1], CorruptImage)
    assert "cannot decode image" in str(got[1])


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("load", [0, 1])
def test_loader_batches_decoded_over_crop_regions_are_the_batches_of_full_decodes(
    shards: Path, num_workers: int, load: int
):
    aug = Augment(size=(32, 32)) if load == 0 else Augment.load_factor(load, size=(32, 32))
    out = {}
    for decoder in ("auto", "nvimgcodec"):
        with Loader(shards, 8, num_workers=num_workers, augment=aug, decoder=decoder) as loader:
            out[decoder] = [(x, y.tolist()) for x, y in loader]
            names = {"auto": workers_decoder_name(aug)}
            assert loader.stats()["decoder"] == names.get(
                decoder, "nvimgcodec crop regions (CPU workers)"
            )
    assert [y for _, y in out["nvimgcodec"]] == [y for _, y in out["auto"]]
    for (xr, _), (xf, _) in zip(out["nvimgcodec"], out["auto"], strict=True):
        assert torch.equal(xr, xf)


def test_loader_over_crop_regions_reports_the_corrupt_sample_as_the_other_paths_do(
    corrupt_shards: Path,
):
    corrupt = {}
    for decoder in ("auto", "nvimgcodec"):
        with Loader(corrupt_shards, 4, num_workers=0, decoder=decoder) as loader:
            labels = [label for _, y in loader for label in y.tolist()]
            corrupt[decoder] = loader.stats()["corrupt_samples"]
        assert labels == [0] * 10
    assert corrupt["nvimgcodec"] == corrupt["auto"] and len(corrupt["auto"]) == 1


def test_crop_regions_asked_for_without_nvimgcodec_fail_at_once_naming_the_extra(
    shards: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", None)  # as if not installed
    with pytest.raises(MissingExtra, match=r"pip install 'gpufeed\[nvimgcodec\]'"):
        Loader(shards, 4, num_workers=0, decoder="nvimgcodec")
