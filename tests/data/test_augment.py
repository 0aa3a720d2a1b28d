"""Batched augmentations: correct geometry, load factor, fused = unfused, device-agnostic parameters."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from gpufeed.data.augment import Augment, sampling_grid
from gpufeed.errors import OptionError


def _smooth(n: int = 4, size: int = 64) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return F.interpolate(
        torch.rand(n, 3, 8, 8, generator=g) * 255, size=(size, size), mode="bilinear"
    )


def test_random_resized_crop_boxes_fit_the_image_and_vary():
    aug = Augment(size=(32, 32))
    boxes = aug.boxes([(300, 500)] * 50, torch.Generator().manual_seed(1))
    for y, x, h, w in boxes:
        assert y >= 0 and x >= 0 and y + h <= 300 and x + w <= 500 and h > 0 and w > 0
    assert len(set(boxes)) == 50


def test_eval_crop_is_a_deterministic_center_crop():
    aug = Augment(size=(100, 100), train=False)
    assert aug.boxes([(200, 400)], torch.Generator()) == [(12, 112, 175, 175)]


def test_decode_size_lets_jpeg_scale_down_when_the_crop_is_large():
    aug = Augment(size=(224, 224))
    assert aug.min_decode_size((1000, 1000), (0, 0, 1000, 1000)) == (224, 224)
    assert aug.min_decode_size((1000, 1000), (0, 0, 224, 224)) == (1000, 1000)


def test_flips_only_load_is_exact_and_fused_equals_unfused():
    x = _smooth()
    params = Augment(load=3, degrees=0).flips_and_angles(4, torch.Generator().manual_seed(2))
    unfused = Augment(load=3, degrees=0).apply_batch(x.clone(), params, torch.float32)
    fused = Augment(load=3, degrees=0, fused=True).apply_batch(x.clone(), params, torch.float32)
    torch.testing.assert_close(unfused, fused, atol=1e-4, rtol=0)
    h, v, _ = params
    flip_h, flip_v = h.sum(0) % 2 == 1, v.sum(0) % 2 == 1
    expect = x.clone()
    for i in range(4):
        if flip_h[i]:
            expect[i] = expect[i].flip(-1)
        if flip_v[i]:
            expect[i] = expect[i].flip(-2)
    want = Augment(load=0).apply_batch(
        expect, Augment(load=0).flips_and_angles(4, torch.Generator()), torch.float32
    )
    torch.testing.assert_close(unfused, want, atol=1e-4, rtol=0)


def test_rotations_compose_the_same_fused_or_unfused_away_from_the_border():
    x = _smooth()
    aug = Augment(load=4, degrees=20)
    params = aug.flips_and_angles(4, torch.Generator().manual_seed(3))
    unfused = aug.apply_batch(x.clone(), params, torch.float32)
    fused = Augment(load=4, degrees=20, fused=True).apply_batch(x.clone(), params, torch.float32)
    c = slice(22, 42)
    assert (unfused - fused)[..., c, c].abs().mean() < 0.03 * unfused[..., c, c].abs().mean()


def test_load_factor_draws_l_independent_flip_flip_rotation_blocks():
    h, v, a = Augment.load_factor(12).flips_and_angles(256, torch.Generator().manual_seed(0))
    assert h.shape == v.shape == a.shape == (12, 256)
    assert 0.4 < h.float().mean() < 0.6 and 0.4 < v.float().mean() < 0.6
    assert 0.1 < a.abs().max() <= torch.deg2rad(torch.tensor(15.0))


def test_the_default_is_the_imagenet_training_recipe():
    aug = Augment()
    assert (aug.scale, aug.ratio, aug.hflip, aug.vflip, aug.degrees) == (
        (0.08, 1.0),
        (3 / 4, 4 / 3),
        0.5,
        0.0,
        0.0,
    )
    h, v, a = aug.flips_and_angles(256, torch.Generator().manual_seed(0))
    assert 0.4 < h.float().mean() < 0.6 and not v.any() and not a.any()


def test_a_flip_only_warp_gives_the_resized_crop_mirrored_exactly():
    image = torch.randint(0, 256, (90, 120, 3), dtype=torch.uint8)
    aug, box = Augment(size=(40, 40)), (5, 10, 70, 80)
    resized = aug.crop_resize(image, (90, 120), box).unsqueeze(0)
    for flip in (False, True):
        theta = aug.warps((torch.tensor([[flip]]), torch.tensor([[False]]), torch.zeros(1, 1)))
        got = aug.first_pass(image, (90, 120), box, theta, 0)
        assert got.dtype == torch.uint8
        assert torch.equal(got, resized.flip(-1) if flip else resized)


def test_uint8_output_skips_normalization_and_float_output_is_normalized():
    x = torch.full((2, 3, 8, 8), 255 * 0.485)
    p = Augment(load=0).flips_and_angles(2, torch.Generator())
    out = Augment(load=0).apply_batch(x.clone(), p, torch.float32)
    assert out[:, 0].abs().max() < 1e-5
    u8 = Augment(load=0).apply_batch(x.clone(), p, torch.uint8)
    assert u8.dtype == torch.uint8 and int(u8[0, 0, 0, 0]) == round(255 * 0.485)


@pytest.mark.parametrize("size", [(224, 224), (7, 5)])
@pytest.mark.parametrize("kind", ["uint8 pixels-last", "uint8", "float"])
def test_normalizing_into_pixels_last_memory_gives_the_same_values(size, kind):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 256, (2, 3, *size), generator=g, dtype=torch.uint8)
    if kind == "uint8 pixels-last":
        x = x.contiguous(memory_format=torch.channels_last)
    elif kind == "float":
        x = x.float() + 0.25
    aug = Augment(load=0)
    p = aug.flips_and_angles(2, torch.Generator())
    nhwc = aug.apply_batch(x, p, torch.float32, channels_last=True)
    nchw = aug.apply_batch(x, p, torch.float32, channels_last=False)
    assert nhwc.permute(0, 2, 3, 1).is_contiguous()
    assert torch.equal(nhwc, nchw)
    mean = torch.tensor(aug.mean).view(1, 3, 1, 1)
    std = torch.tensor(aug.std).view(1, 3, 1, 1)
    torch.testing.assert_close(nhwc, (x.float() / 255 - mean) / std)


def _photo(h: int, w: int) -> torch.Tensor:
    """A smooth H×W×3 uint8 image, as a decoder returns it."""
    return _smooth(1, 256)[0, :, :h, :w].permute(1, 2, 0).round().to(torch.uint8).contiguous()


def test_crop_warp_equals_crop_resize_then_warp_in_one_resampling():
    aug = Augment(size=(80, 80), load=1, degrees=30)
    image, box = _photo(150, 200), (20, 30, 100, 110)  # shrinks by 1.25-1.4: direct warp
    params = aug.flips_and_angles(1, torch.Generator().manual_seed(4))
    theta = aug.warps(params)[0]
    one = aug.crop_warp(image, (150, 200), box, theta)
    two = aug.apply_batch(
        aug.crop_resize(image, (150, 200), box)[None].float(), params, torch.uint8
    )
    one = one.round().clamp(0, 255)
    c = slice(20, 60)
    assert (one - two.float())[..., c, c].abs().mean() < 0.02 * two[..., c, c].float().mean()


def test_heavily_shrunk_crops_are_antialiased_before_the_warp():
    stripes = torch.zeros(400, 400, 3, dtype=torch.uint8)
    stripes[:, ::2] = 255  # one-pixel stripes alias badly under plain bilinear sampling
    aug = Augment(size=(60, 60), degrees=0, hflip=0, vflip=0)
    theta = aug.warps(aug.flips_and_angles(1, torch.Generator()))[0]
    out = aug.crop_warp(stripes, (400, 400), (0, 0, 400, 400), theta)
    assert abs(out.mean().item() - 127.5) < 3 and out[..., 5:-5, 5:-5].std().item() < 5


def test_unfused_load_is_one_warp_per_repetition_and_fused_is_one_in_all():
    gen = torch.Generator().manual_seed(0)
    assert len(Augment(load=5).warps(Augment(load=5).flips_and_angles(3, gen))) == 5
    fused = Augment(load=5, fused=True)
    assert [w.shape for w in fused.warps(fused.flips_and_angles(3, gen))] == [(3, 2, 3)]
    assert Augment(load=0).warps(Augment(load=0).flips_and_angles(3, gen)) == []


def test_center_crop_when_no_random_box_fits():
    aug = Augment(scale=(1.0, 1.0))  # the whole area at a ratio other than the image's: none fits
    assert aug.boxes([(100, 400), (300, 300)], torch.Generator()) == [
        (0, 133, 100, 133),
        (0, 0, 300, 300),
    ]


def test_apply_batch_leaves_its_input_untouched():
    x = _smooth()
    before = x.clone()
    for load in (0, 2):
        aug = Augment(load=load)
        aug.apply_batch(x, aug.flips_and_angles(4, torch.Generator()), torch.float32)
        aug.apply_batch(x, aug.flips_and_angles(4, torch.Generator()), torch.uint8)
    assert torch.equal(x, before)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"size": 0}, "Augment size must be an integer >= 1, got 0"),
        ({"size": (224,)}, "Augment size must be an integer or (height, width), got (224,)"),
        ({"size": 16.5}, "Augment size must be an integer or (height, width), got 16.5"),
        ({"scale": (1.0, 0.08)}, "Augment scale=(1.0, 0.08): give the least value first"),
        ({"scale": (0.0, 1.0)}, "Augment scale[0] must be a number above 0 up to 1, got 0.0"),
        ({"ratio": (0, 0)}, "Augment ratio[0] must be a number above 0 up to 1000, got 0"),
        ({"mean": (0.5, 0.5)}, "Augment mean must be 3 numbers, got (0.5, 0.5)"),
        ({"mean": (123.7, 116.3, 103.5)}, "Augment mean[0] must be a number from 0 to 1"),
        ({"std": (0.0, 1.0, 1.0)}, "Augment std[0] must be a number above 0 up to 1, got 0.0"),
        ({"hflip": 2}, "Augment hflip must be a number from 0 to 1, got 2"),
        ({"degrees": float("nan")}, "Augment degrees must be a number from -360 to 360, got nan"),
        ({"load": 1.5}, "Augment load must be an integer >= 0, got 1.5"),
    ],
)
def test_an_option_that_cannot_work_is_refused_when_the_augment_is_made(options, message):
    # each used to pass, then fail at the first batch (or, a zero std, give NaN batches)
    with pytest.raises(OptionError, match=re.escape(message)):
        Augment(**options)


def test_flags_negative_degrees_and_tensors_are_taken_as_the_numbers_they_mean():
    aug = Augment(hflip=False, vflip=True, degrees=-15, mean=torch.tensor([0.5, 0.5, 0.5]))
    assert (aug.hflip, aug.vflip, aug.degrees, aug.mean) == (0.0, 1.0, -15.0, (0.5,) * 3)


def test_sizes_and_normalization_given_as_lists_are_kept_as_tuples():
    aug = Augment(size=[32, 48], mean=[0.5, 0.5, 0.5], std=[0.25, 0.25, 0.25])
    assert aug.size == (32, 48) and aug.mean == (0.5,) * 3 and aug.std == (0.25,) * 3
    hash(aug)  # a frozen Augment stays hashable


def test_transform_on_must_name_a_place():
    with pytest.raises(ValueError, match=r"transform_on='gpu': choose one of worker, device"):
        Augment(transform=lambda x: x, transform_on="gpu")
    with pytest.raises(ValueError, match="transform must be a callable on a batch tensor"):
        Augment(transform="invert")  # type: ignore[arg-type]


def test_a_worker_transform_that_changes_the_batch_shape_is_a_clear_error():
    aug = Augment(transform=lambda x: x[:, :1])
    with pytest.raises(ValueError, match=r"returned \(2, 1, 8, 8\).*transform_on='device'"):
        aug.worker_transform(torch.zeros(2, 3, 8, 8, dtype=torch.uint8))


def test_the_sampling_grid_is_affine_grids():
    theta = torch.randn(5, 2, 3, generator=torch.Generator().manual_seed(0))
    want = F.affine_grid(theta, [5, 3, 24, 40], align_corners=False)
    assert torch.allclose(sampling_grid(theta, (24, 40)), want, atol=1e-6)


@pytest.mark.parametrize("channels_last", [True, False])
def test_a_warped_float_batch_is_rounded_into_uint8_in_either_memory_layout(channels_last):
    x = torch.tensor([-3.0, 0.5, 1.5, 2.49, 254.5, 300.0]).repeat(2, 3, 4, 1)  # 2×3×4×6
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    out = torch.empty(x.shape, dtype=torch.uint8, memory_format=fmt)
    got = Augment().finish(x.clone(), [], out, owned=True)
    assert got.shape == x.shape and got.data_ptr() == out.data_ptr()  # `out`, N×3×H×W
    assert out.is_contiguous(memory_format=fmt)
    assert out[1, 2, 3].tolist() == [0, 0, 2, 2, 254, 255]  # half to even, clamped
    assert torch.equal(out, x.round().clamp(0, 255).to(torch.uint8))
