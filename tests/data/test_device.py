"""The device stage: normalization of uint8 slots in one op, the encoded hand-off's random
parameters, and `resample_batch`, the batched crop + resize + first warp of GPU preprocessing
(which runs on CPU too, on a float32 canvas)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gpufeed.data import canvases
from gpufeed.data.augment import Augment, _rotation
from gpufeed.data.batch import batch_generator, build_batch
from gpufeed.data.canvases import fill_canvases, padded_canvases, resample_batch
from gpufeed.data.dataset import ShardDataset
from gpufeed.data.decode import image_size
from gpufeed.data.device import DeviceStage
from gpufeed.data.placement import Placement
from gpufeed.data.plan import Position
from gpufeed.data.produce import fill_slot
from gpufeed.data.slots import Slots
from gpufeed.data.spec import BatchSpec

OUT = (64, 64)
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _spec(handoff: str = "decoded", dtype: torch.dtype = torch.float32, **kw) -> BatchSpec:
    fields = dict(
        batch_size=4,
        augment=Augment.load_factor(2, size=(16, 16)),
        placement=Placement.of(handoff),
        dtype=dtype,
        channels_last=False,
        strict=True,
        max_sample_bytes=1 << 16,
    )
    fields.update(kw)
    return BatchSpec(**fields)  # type: ignore[arg-type]


def _stage(spec: BatchSpec, device: str = "cpu") -> DeviceStage:
    slots = Slots(spec, 1, 2)
    return DeviceStage(spec, torch.device(device), slots, pinned=False, seed=0, rank=0)


# --- normalization ----------------------------------------------------------------------------


@pytest.mark.parametrize("channels_last", [False, True])
def test_normalize_maps_uint8_to_the_augment_normalization(channels_last: bool):
    spec = _spec(channels_last=channels_last)
    x = torch.randint(0, 256, (4, 16, 16, 3), dtype=torch.uint8).permute(0, 3, 1, 2)  # a slot
    out = _stage(spec).normalize(x)
    mean = torch.tensor(spec.augment.mean).view(1, 3, 1, 1)
    std = torch.tensor(spec.augment.std).view(1, 3, 1, 1)
    torch.testing.assert_close(out, (x.float() / 255 - mean) / std, atol=1e-5, rtol=0)
    assert out.dtype == torch.float32
    assert out.is_contiguous(
        memory_format=torch.channels_last if channels_last else torch.contiguous_format
    )


def test_normalize_with_uint8_output_only_lays_the_batch_out():
    x = torch.randint(0, 256, (4, 16, 16, 3), dtype=torch.uint8).permute(0, 3, 1, 2)
    out = _stage(_spec(dtype=torch.uint8)).normalize(x)
    assert out.dtype == torch.uint8 and torch.equal(out, x) and out.is_contiguous()


# --- the decoded hand-off: uint8 slots, normalized by the stage -------------------------------


@pytest.mark.parametrize("channels_last", [False, True])
def test_a_uint8_slot_becomes_the_float_batch_of_the_cpu_path(shards: Path, channels_last: bool):
    """The worker rounds to uint8 into its slot, the stage normalizes: the batch `build_batch`
    makes straight to float, up to that rounding; a copy, never a view of the reused slot."""
    samples = list(ShardDataset(shards, shuffle=False).iter_worker(0, 1))[:4]
    spec = _spec(channels_last=channels_last)
    slots = Slots(spec, 1, 2)
    stage = DeviceStage(spec, torch.device("cpu"), slots, pinned=False, seed=5, rank=1)
    at = Position(3, 7)
    meta = fill_slot(samples, at, slots, 1, seed=5, rank=1)
    assert slots.images.dtype == torch.uint8
    batch, _ = stage.from_slot(at, 1, meta)
    gen = batch_generator(5, 3, 1, 7)
    want, want_labels, _ = build_batch(
        samples, spec.augment, gen, dtype=torch.float32, channels_last=False, strict=True
    )
    tol = 0.5 / 255 / min(spec.augment.std) + 1e-4
    assert batch.at == at and torch.equal(batch.labels, want_labels)
    assert (batch.images - want).abs().max() <= tol
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    assert batch.images.dtype == torch.float32 and batch.images.is_contiguous(memory_format=fmt)
    before = batch.images.clone()
    slots.images.fill_(0)  # the slot is reused
    slots.labels.fill_(-1)
    assert torch.equal(batch.images, before) and torch.equal(batch.labels, want_labels)


# --- the encoded hand-off ---------------------------------------------------------------------


def test_encoded_slots_carry_the_bytes_and_the_random_parameters_of_the_cpu_path(shards: Path):
    """A worker handing over JPEG bytes also draws each image's crop box, flips and angles, from
    the same per-batch generator and in the same order as `build_batch` on CPU workers."""
    samples = list(ShardDataset(shards, shuffle=False).iter_worker(0, 1))[:4]
    spec = _spec("encoded", max_sample_bytes=max(len(s.data) for s in samples))
    slots = Slots(spec, 1, 2)
    at = Position(3, 7)
    meta = fill_slot(samples, at, slots, 1, seed=5, rank=1)
    assert meta.n == 4 and meta.keys == tuple((s.shard, s.key) for s in samples)
    offs = slots.offsets[1].tolist()
    data = slots.images[1].numpy()
    assert [data[offs[i] : offs[i + 1]].tobytes() for i in range(4)] == [s.data for s in samples]
    assert slots.labels[1, :4].tolist() == [s.label for s in samples]

    aug = spec.augment
    gen = batch_generator(5, 3, 1, 7)
    sizes = [image_size(s.data) for s in samples]
    boxes = aug.boxes(sizes, gen)
    hflip, vflip, angle = aug.flips_and_angles(4, gen)
    params = spec.params.unpack(slots.params[1, :4])
    assert list(params) == ["size", "box", "hflip", "vflip", "angle"]
    assert params["size"].long().tolist() == [list(s) for s in sizes]
    assert params["box"].long().tolist() == [list(b) for b in boxes]
    assert torch.equal(params["hflip"].T.bool(), hflip)
    assert torch.equal(params["vflip"].T.bool(), vflip)
    torch.testing.assert_close(params["angle"].T.float(), angle)


def test_an_image_larger_than_the_index_says_is_the_one_left_out_of_an_encoded_slot(shards: Path):
    from gpufeed.data.dataset import RawSample

    samples = list(ShardDataset(shards, shuffle=False).iter_worker(0, 1))[:4]
    bound = max(len(s.data) for s in samples)
    big = RawSample(samples[0].shard, "big", 0, samples[0].data * 3)  # its size understated
    slots = Slots(_spec("encoded", max_sample_bytes=bound), 1, 1)
    meta = fill_slot([big, *samples[1:]], Position(0, 0), slots, 0, seed=0, rank=0)
    assert list(meta.bad) == [0]  # not the later images it would have crowded out
    assert f"more than the index bounds images to ({bound:,})" in meta.bad[0]


# --- resample_batch ---------------------------------------------------------------------------


def _smooth_image(h: int, w: int, gen: torch.Generator) -> torch.Tensor:
    """A photo-like uint8 3×h×w image: random noise, blurred (pure noise has no real scale)."""
    x = torch.rand(1, 3, h // 4 + 2, w // 4 + 2, generator=gen) * 255
    x = F.interpolate(x, size=(h, w), mode="bicubic", align_corners=False)
    return x.clamp(0, 255).round().to(torch.uint8)[0]


def _cases(n: int, seed: int = 0):
    """(image 3×h×w, box) with h, w in 40..80 and a box of 20..60 px (never larger than the
    output: no downscale)."""
    gen = torch.Generator().manual_seed(seed)

    def rint(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (1,), generator=gen))

    for _ in range(n):
        h, w = rint(40, 80), rint(40, 80)
        bh, bw = min(h, rint(20, 60)), min(w, rint(20, 60))
        box = (rint(0, h - bh), rint(0, w - bw), bh, bw)
        yield _smooth_image(h, w, gen), box


def _rotation_theta(degrees: float) -> torch.Tensor:
    return _rotation(torch.tensor([math.radians(degrees)]))  # 1×2×3


def _crop_warp(image: torch.Tensor, box, theta: torch.Tensor) -> torch.Tensor:
    h, w = image.shape[1:]
    return Augment(size=OUT).crop_warp(image.permute(1, 2, 0), (h, w), box, theta)[0]


def _inside(box) -> tuple[slice, slice]:
    """Output pixels whose bilinear taps all fall inside the (upscaled) crop box."""
    _, _, bh, bw = box
    my, mx = math.ceil(OUT[0] / (2 * bh)), math.ceil(OUT[1] / (2 * bw))
    return slice(my, OUT[0] - my), slice(mx, OUT[1] - mx)


def test_resample_matches_crop_warp_for_identity_warps_inside_the_crop():
    for image, box in _cases(12):
        got = resample_batch([image], [box], torch.eye(2, 3)[None], OUT)[0]
        ref = _crop_warp(image, box, torch.eye(2, 3)[None])
        ys, xs = _inside(box)
        assert got.shape == (3, *OUT) and got.dtype == torch.float32
        assert (got - ref)[:, ys, xs].abs().max() < 1.0, box


@pytest.mark.parametrize("degrees", [-7.0, 4.0])
def test_resample_matches_crop_warp_for_small_rotations_in_the_centre(degrees: float):
    """Where a rotation reaches past the crop, the canvas samples the surrounding image and the
    CPU path samples black: compare the centre, which both take from inside the crop."""
    theta = _rotation_theta(degrees)
    for image, box in _cases(12, seed=1):
        got = resample_batch([image], [box], theta, OUT)[0]
        ref = _crop_warp(image, box, theta)
        assert (got - ref)[:, 16:48, 16:48].abs().max() < 1.0, box


def test_images_of_a_batch_are_resampled_as_if_alone():
    """Images of different sizes share one zero-padded canvas: the padding never leaks in."""
    cases = list(_cases(6, seed=2))
    theta = torch.cat([_rotation_theta(d) for d in (0, 3, -3, 5, -5, 1)])
    together = resample_batch([im for im, _ in cases], [b for _, b in cases], theta, OUT)
    for k, (image, box) in enumerate(cases):
        alone = resample_batch([image], [box], theta[k : k + 1], OUT)[0]
        torch.testing.assert_close(together[k], alone, atol=0.01, rtol=0)  # float32 coords


def test_a_padded_batch_makes_the_canvases_of_its_images(monkeypatch: pytest.MonkeyPatch):
    """DALI's zero-padded uint8 N×H×W×3 output gives the canvases `fill_canvases` makes of the
    same images, split alike when one canvas would be too large."""
    gen = torch.Generator().manual_seed(5)
    images = [
        _smooth_image(h, w, gen) for h, w in ((40, 52), (48, 44), (36, 60), (44, 40), (40, 40))
    ]
    padded = torch.zeros((5, 48, 60, 3), dtype=torch.uint8)
    for k, im in enumerate(images):
        padded[k, : im.shape[1], : im.shape[2]] = im.permute(1, 2, 0)
    monkeypatch.setattr(canvases, "CANVAS_ELEMENTS", 2 * 3 * 48 * 60)  # two images per canvas
    got, want = padded_canvases(padded), fill_canvases(images)
    assert [c.shape[0] for c in got] == [c.shape[0] for c in want] == [2, 2, 1]
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert got[0].dtype == torch.float32 and got[0].is_contiguous()


def test_no_warp_is_a_plain_crop_and_resize():
    image, box = next(_cases(1, seed=3))
    torch.testing.assert_close(
        resample_batch([image], [box], None, OUT),
        resample_batch([image], [box], torch.eye(2, 3)[None], OUT),
    )


def test_a_downscale_is_antialiased():
    """A 1-px checkerboard shrunk ~4×: plain bilinear or nearest sampling aliases it into a
    strong pattern; the supersampled resampling averages it to flat grey, as a box filter does."""
    n = 256
    yy, xx = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    board = (((yy + xx) % 2) * 255).to(torch.uint8).expand(3, n, n).contiguous()
    box = (3, 3, 250, 250)  # not a whole multiple of the output: samples fall everywhere
    got = resample_batch([board], [box], torch.eye(2, 3)[None], OUT)[0]
    crop = board[:, 3:253, 3:253][None].float()
    grid = F.affine_grid(torch.eye(2, 3)[None], [1, 3, *OUT], align_corners=False)
    plain = {
        mode: F.grid_sample(crop, grid, mode=mode, align_corners=False)[0]
        for mode in ("bilinear", "nearest")
    }
    assert abs(got.mean().item() - 127.5) < 1.0
    assert got.std() < 2.0
    assert all(x.std() > 20 * got.std() for x in plain.values())


@pytest.mark.xfail(
    strict=True,
    reason="Augment.crop_warp samples the crop with zero padding, so an upscaled crop gets a "
    "dark frame (outer 1-2 px) that the canvas path (and crop_resize) does not have",
)
def test_resample_matches_crop_warp_for_identity_warps_on_the_whole_image():
    for image, box in _cases(12):
        got = resample_batch([image], [box], torch.eye(2, 3)[None], OUT)[0]
        ref = _crop_warp(image, box, torch.eye(2, 3)[None])
        assert (got - ref).abs().max() < 1.0, box


@gpu
@needs_cuda
def test_resample_on_cuda_matches_cpu():
    cases = list(_cases(8, seed=4))
    theta = torch.cat([_rotation_theta(d) for d in (0, 3, -3, 5, -5, 1, 2, -2)])
    boxes = [b for _, b in cases]
    cpu = resample_batch([im for im, _ in cases], boxes, theta, OUT)
    cuda = resample_batch([im.cuda() for im, _ in cases], boxes, theta.cuda(), OUT)
    assert cuda.is_cuda
    diff = (cuda.cpu() - cpu).abs()
    # a float16 canvas samples at float16 coordinates: up to ~0.1 px off, seen only at sharp edges
    # on an H200: mean 0.10, 0.12% of values off by more than 1, at most 4.5 (a wrong crop: tens)
    assert diff.mean() < 0.5 and (diff > 1.0).float().mean() < 0.01 and diff.max() < 16


@gpu
@needs_cuda
def test_normalize_on_cuda_matches_cpu():
    x = torch.randint(0, 256, (4, 16, 16, 3), dtype=torch.uint8).permute(0, 3, 1, 2)
    spec = _spec(channels_last=True)
    cpu = _stage(spec).normalize(x)
    cuda = _stage(spec, "cuda").normalize(x.cuda())
    assert cuda.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(cuda.cpu(), cpu, atol=1e-5, rtol=0)
