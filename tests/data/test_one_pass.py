"""One native pass from JPEG bytes to the batch makes the very batch of the steps one by one
(decode, torch's antialiased resize, flips, normalization), bit for bit, in every layout and
dtype a worker writes, with its vectorized passes and with its plain C ones; corrupt images get
the steps' verdicts and messages and are left out in order; threads change nothing."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
import torch
from jpegs import jpeg, photo
from PIL import Image

from gpufeed.data import jpeg_region
from gpufeed.data.augment import Augment
from gpufeed.data.batch import CorruptSampleError, batch_generator, build_batch, cpu_decoder
from gpufeed.data.dataset import RawSample
from gpufeed.data.loader import Loader
from gpufeed.data.one_pass import applies
from gpufeed.errors import OptionError

if not jpeg_region.available():
    if os.environ.get("CI"):  # the CI machine has a compiler and libjpeg's headers: it must build
        pytest.fail("gpufeed.data._jpeg_region was not built", pytrace=False)
    pytest.skip("gpufeed was installed without its crop-region decoder", allow_module_level=True)

from gpufeed.data import _jpeg_region  # built: checked above


class Counting(jpeg_region.CropDecoder):
    """The crop decoder, counting the images its one native pass was given."""

    def __init__(self, threads: int = 1) -> None:
        super().__init__(threads)
        self.filled = 0
        if self.fill is not None:
            inner = self.fill

            def fill(augment, datas, *rest):  # type: ignore[no-untyped-def]
                self.filled += len(datas)
                return inner(augment, datas, *rest)

            self.fill = fill


def _samples() -> list[RawSample]:
    """JPEGs of every layout and size class: larger and smaller than the output, gray, 4:4:4,
    progressive, portrait and landscape."""
    gray = io.BytesIO()
    Image.fromarray(photo(90, 70, 9)[..., 0]).save(gray, "JPEG", quality=90)
    datas = [
        jpeg(301, 437, 0),
        jpeg(40, 33, 1),  # smaller than the output: upsampled
        jpeg(512, 200, 2, subsampling=0),
        jpeg(180, 260, 3, progressive=True),
        gray.getvalue(),
        jpeg(64, 64, 5, subsampling=1),
        jpeg(333, 290, 6),
        jpeg(120, 480, 7),
    ]
    return [RawSample("s0", f"k{i}", i % 3, d) for i, d in enumerate(datas)]


def _batch(samples, aug, decoder, *, dtype=torch.float32, last=False, seed=4, **kw):
    return build_batch(
        samples, aug, batch_generator(seed, 0, 0, 1), dtype=dtype, channels_last=last,
        strict=kw.pop("strict", False), decoder=decoder, **kw,
    )  # fmt: skip


needs_one_pass = pytest.mark.skipif(
    not jpeg_region.one_pass_available(), reason="no vectorized resize on this CPU"
)

RECIPES = {
    "imagenet": Augment(size=(48, 56)),
    "eval": Augment(size=(40, 40), train=False),
    "both flips": Augment(size=(32, 48), hflip=1.0, vflip=1.0),
    "flips by chance": Augment(size=(56, 40), hflip=0.5, vflip=0.5, load=3, fused=True),
}


@needs_one_pass
@pytest.mark.parametrize("vector", [True, False], ids=["avx2", "plain"])
@pytest.mark.parametrize("recipe", sorted(RECIPES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8], ids=["float32", "uint8"])
@pytest.mark.parametrize("last", [False, True], ids=["nchw", "nhwc"])
def test_one_pass_makes_the_batch_of_the_steps_bit_for_bit(vector, recipe, dtype, last):
    aug, samples = RECIPES[recipe], _samples()
    counting = Counting()
    was = _jpeg_region.vector_passes(vector)
    try:
        got, labels, corrupt = _batch(samples, aug, counting, dtype=dtype, last=last)
    finally:
        _jpeg_region.vector_passes(was)
    want, want_labels, _ = _batch(samples, aug, cpu_decoder, dtype=dtype, last=last)
    assert counting.filled == len(samples)  # the native pass made every image
    assert corrupt == [] and torch.equal(labels, want_labels)
    assert got.dtype == dtype and torch.equal(got, want)


@needs_one_pass
def test_corrupt_images_get_the_steps_verdicts_and_the_rest_keep_their_order():
    samples = _samples()
    cut = samples[2].data[: len(samples[2].data) // 2]  # a JPEG cut short
    png = io.BytesIO()
    Image.fromarray(photo(50, 60, 8)).save(png, "PNG")  # decoded by the steps instead
    samples[2] = RawSample("s0", "cut", 2, cut)
    samples[4] = RawSample("s0", "png", 1, png.getvalue())
    samples[6] = RawSample("s0", "junk", 0, b"\xff\xd8 not really a jpeg")  # a header refused
    aug = Augment(size=(48, 48))
    got = _batch(samples, aug, Counting())
    want = _batch(samples, aug, cpu_decoder)
    assert [key for _, key, _ in got[2]] == ["junk", "cut"]
    assert got[2] == want[2] and torch.equal(got[1], want[1])
    assert got[0].shape[0] == len(samples) - 2 and torch.equal(got[0], want[0])
    with pytest.raises(CorruptSampleError, match="key junk") as raised:
        _batch(samples, aug, Counting(), strict=True)
    with pytest.raises(CorruptSampleError) as steps:
        _batch(samples, aug, cpu_decoder, strict=True)
    assert str(raised.value) == str(steps.value)


@needs_one_pass
def test_threads_make_the_same_batch():
    samples, aug = _samples() * 3, Augment(size=(64, 64))
    one = _batch(samples, aug, jpeg_region.CropDecoder(1))[0]
    three = _batch(samples, aug, jpeg_region.CropDecoder(3))[0]
    assert torch.equal(one, three)


@needs_one_pass
def test_later_warps_left_to_the_device_still_go_in_one_pass():
    aug = Augment(size=(40, 40), load=2, hflip=0.5, vflip=0.5)  # two flip-only repetitions
    counting, rest, rest_steps = Counting(), [], []
    got = _batch(_samples(), aug, counting, dtype=torch.uint8, rest=rest)
    want = _batch(_samples(), aug, cpu_decoder, dtype=torch.uint8, rest=rest_steps)
    assert counting.filled == len(_samples())
    assert torch.equal(got[0], want[0]) and len(rest) == len(rest_steps) == 1
    assert torch.equal(rest[0], rest_steps[0])


@needs_one_pass
def test_a_rotation_or_a_float16_batch_takes_the_steps():
    counting = Counting()
    _batch(_samples(), Augment.load_factor(1, size=(32, 32)), counting)
    _batch(_samples(), Augment(size=(32, 32)), counting, dtype=torch.float16)
    assert counting.filled == 0


def test_a_bad_plan_is_refused_before_anything_is_decoded():
    out = np.zeros((1, 8, 8, 3), np.uint8)
    plan = np.array([[1, 8, 0, 4, 0, 4, 0, 0]], np.int32)  # image 1 of a one-image batch
    with pytest.raises(ValueError, match="bad plan row 0"):
        _jpeg_region.fill_batch([jpeg(16, 16)], plan.tobytes(), out, 8, 8, 0, None, 2, 1)
    with pytest.raises(ValueError, match="bad sizes, plan or norm"):
        _jpeg_region.fill_batch([jpeg(16, 16)], plan[:, :5].tobytes(), out, 8, 8, 0, None, 2, 1)


@pytest.mark.parametrize("threads", [0, 65, 2.5, "2"])
def test_decode_threads_must_be_a_whole_number_from_one_to_64(shards, threads):
    with pytest.raises(OptionError, match=r"decode_threads must be an integer from 1 to 64, got"):
        Loader(shards, 8, decode_threads=threads)


@needs_one_pass
def test_a_loader_says_it_takes_batches_in_one_pass_and_with_how_many_threads(shards):
    aug = Augment(size=(32, 32))
    with Loader(shards, 8, num_workers=1, augment=aug, decode_threads=2) as loader:
        assert applies(loader.spec())
        assert loader.stats()["decoder"] == (
            "libjpeg-turbo crop regions, one pass to the batch (CPU workers, 2 threads each)"
        )
        threaded = [x for x, _ in loader]
    with Loader(shards, 8, num_workers=1, augment=aug, decoder="cpu") as loader:
        steps = [x for x, _ in loader]
    assert len(threaded) == len(steps) > 0
    assert all(torch.equal(a, b) for a, b in zip(threaded, steps, strict=True))
