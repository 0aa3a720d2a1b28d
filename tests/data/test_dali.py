"""NVIDIA DALI (and nvImageCodec, the library under it) as the device stage's decoder
(`Loader(decoder="dali" | "nvimgcodec")`), run here with their CPU decoders: the real pipeline
(external source, decoder, padding) with the batches, exactly-once delivery, resumption and
corrupt-sample reports of the other paths; the choice of decoder, and the clear error when DALI
is not installed or cannot run on the device."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from loader_helpers import workers_decoder_name

from gpufeed.data.augment import Augment
from gpufeed.data.batch import CorruptSampleError
from gpufeed.data.dataset import ShardDataset
from gpufeed.data.decode import decode
from gpufeed.data.device import decoder_name, describe_decoder, open_decoder
from gpufeed.data.loader import Loader
from gpufeed.data.placement import Placement
from gpufeed.data.spec import BatchSpec
from gpufeed.errors import GpufeedError
from gpufeed.extras import MissingExtra

EVAL = Augment(train=False, size=(32, 32))  # identity-like: a center crop, no flips
AUG = Augment.load_factor(2, size=(32, 32))

MakeLoader = Callable[..., Loader]


@pytest.fixture
def dali() -> Any:
    return pytest.importorskip("nvidia.dali")


@pytest.fixture(params=["dali", "nvimgcodec"])
def library(request: pytest.FixtureRequest) -> str:
    """The decoder option of each library, skipped where it is not installed."""
    pytest.importorskip({"dali": "nvidia.dali", "nvimgcodec": "nvidia.nvimgcodec"}[request.param])
    return request.param


@pytest.fixture
def make() -> Iterator[MakeLoader]:
    """`make(data, batch_size, **options)`: a GPU-preprocessing Loader on the CPU (DALI by
    default), closed after the test."""
    defaults = {"augment": EVAL, "device": "cpu", "preprocess": "gpu", "decoder": "dali"}
    with ExitStack() as made:
        yield lambda data, batch_size, **kw: made.enter_context(
            Loader(data, batch_size, **{**defaults, **kw})
        )


def _batches(loader: Loader) -> list[tuple[torch.Tensor, list[int]]]:
    return [(images, labels.tolist()) for images, labels in loader]


# --- the decoder itself -----------------------------------------------------------------------


def test_dali_decodes_a_batch_into_one_zero_padded_canvas_as_libjpeg_turbo_does(
    shards: Path, dali: Any
):
    from gpufeed.data.dali import DaliDecoder

    samples = list(ShardDataset(shards, shuffle=False).iter_worker(0, 1))[:5]
    padded = DaliDecoder(torch.device("cpu"), 8).decode(
        [np.frombuffer(s.data, np.uint8) for s in samples]
    )
    want = [torch.from_numpy(decode(s.data)) for s in samples]
    assert padded.dtype == torch.uint8 and padded.shape == (
        5,
        max(w.shape[0] for w in want),
        max(w.shape[1] for w in want),
        3,
    )
    for k, w in enumerate(want):
        h, wd = w.shape[:2]
        # both libjpeg-turbo: the same pixels (here exactly), up to rounding in another build
        assert (padded[k, :h, :wd].int() - w.int()).abs().max() <= 2
        assert not padded[k, h:].any() and not padded[k, :, wd:].any()


# --- the Loader with decoder="dali" or "nvimgcodec" --------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dali_batches_are_the_libjpeg_turbo_batches(
    shards: Path, make: MakeLoader, library: str, num_workers: int
):
    out = {}
    for decoder in ("cpu", library):
        loader = make(shards, 8, num_workers=num_workers, decoder=decoder, seed=1)
        loader.set_epoch(2)
        out[decoder] = _batches(loader)
        want = f"{library} (cpu)" if decoder == library else "libjpeg-turbo (feeder thread)"
        assert loader.stats()["decoder"] == want
    assert [y for _, y in out[library]] == [y for _, y in out["cpu"]]
    for (xd, _), (xc, _) in zip(out[library], out["cpu"], strict=True):
        assert xd.shape == xc.shape and xd.dtype == xc.dtype == torch.float32
        # libjpeg-turbo decodes DCT-scaled there, full size here, then resamples otherwise: a
        # couple of levels of 255 apart on average (0.04 after normalization), 20 at most
        assert (xd - xc).abs().mean() < 0.06 and (xd - xc).abs().max() < 0.6


def test_dali_with_heavy_augmentation_draws_the_same_crops_and_flips(
    shards: Path, make: MakeLoader, library: str
):
    """Random crops, flips and rotations are drawn by the workers: the same as the CPU path's,
    so (resampled otherwise) the batches agree closely in the mean."""
    out = {
        d: _batches(make(shards, 8, num_workers=2, decoder=d, augment=AUG))
        for d in ("cpu", library)
    }
    assert [y for _, y in out[library]] == [y for _, y in out["cpu"]]
    for (xd, _), (xc, _) in zip(out[library], out["cpu"], strict=True):
        assert (xd - xc).abs().mean() < 0.15


def test_dali_delivers_every_sample_once_per_epoch_and_resumes_mid_epoch(
    shards: Path, make: MakeLoader, library: str
):
    whole = make(shards, 4, num_workers=2, seed=3, decoder=library)
    epochs = [_batches(whole) for _ in range(2)]  # epochs 0 and 1, no set_epoch
    for epoch in epochs:
        assert sorted(x for _, y in epoch for x in y) == list(range(48))
    assert [y for _, y in epochs[0]] != [y for _, y in epochs[1]]

    loader = make(shards, 4, num_workers=2, seed=3, decoder=library)
    _batches(loader)  # epoch 0
    first = []
    for images, labels in loader:  # epoch 1
        first.append((images, labels.tolist()))
        if len(first) == 5:
            state = loader.state_dict()
            break
    resumed = make(shards, 4, num_workers=2, seed=3, decoder=library)
    resumed.load_state_dict(state)
    rest = _batches(resumed)
    assert [y for _, y in first + rest] == [y for _, y in epochs[1]]
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(first + rest, epochs[1], strict=True))


def test_dali_leaves_a_corrupt_jpeg_out_and_reports_it_by_key(
    corrupt_shards: Path, make: MakeLoader, library: str
):
    loader = make(corrupt_shards, 4, num_workers=0, decoder=library)
    got = [y for _, y in _batches(loader)]
    assert [x for b in got for x in b] == [0] * 10  # the ten good ones, the bad one left out
    (report,) = loader.stats()["corrupt_samples"]
    assert report["shard"].endswith("shard-00000.tar") and report["key"].endswith("_bad")
    assert "decode" in report["reason"]
    assert _batches(loader)  # the pipeline decodes the next epoch


def test_dali_strict_raises_naming_the_corrupt_sample(
    corrupt_shards: Path, make: MakeLoader, library: str
):
    loader = make(corrupt_shards, 4, num_workers=0, strict=True, decoder=library)
    with pytest.raises(CorruptSampleError, match=r"shard .*shard-00000\.tar, key \S*_bad"):
        _batches(loader)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_a_library_that_cannot_run_on_the_device_is_a_clear_error(library: str):
    from gpufeed.data.dali import DaliDecoder
    from gpufeed.data.nvimgcodec import NvImageCodecDecoder

    cuda = torch.device("cuda:0")
    with pytest.raises(GpufeedError, match=r"cannot decode on cuda:0 .*decoder='nvjpeg'"):
        DaliDecoder(cuda, 8) if library == "dali" else NvImageCodecDecoder(cuda)


# --- choosing the decoder ---------------------------------------------------------------------


def _encoded(decoder: str) -> BatchSpec:
    """The spec of a GPU-preprocessing Loader's batches of 8 with `decoder`."""
    return BatchSpec(
        8, EVAL, Placement.of("encoded"), torch.float32, False, False, 1 << 20, decoder=decoder
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_auto_gives_way_with_a_warning_when_dali_cannot_start_on_the_device(dali: Any):
    spec = _encoded("auto")
    cuda = torch.device("cuda:0")  # DALI is installed but finds no CUDA driver here, for real
    with pytest.warns(
        RuntimeWarning,
        match=r"auto' decodes with libjpeg-turbo .*, not DALI: NVIDIA DALI cannot decode on cuda:0",
    ):
        choice, library = open_decoder(spec, cuda)
    assert (choice, library) == ("cpu", None)
    assert describe_decoder(choice, cuda) != decoder_name(spec, cuda) == "dali (mixed)"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_dali_asked_for_by_name_that_cannot_start_stays_a_clear_error(dali: Any):
    spec = _encoded("dali")
    with pytest.raises(GpufeedError, match=r"cannot decode on cuda:0 .*decoder='nvjpeg'"):
        open_decoder(spec, torch.device("cuda:0"))


def test_dali_asked_for_but_missing_is_a_clear_error_naming_the_extra(
    shards: Path, make: MakeLoader, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)  # as if not installed
    with pytest.raises(MissingExtra, match=r"pip install 'gpufeed\[dali\]'"):
        make(shards, 4)
    # "auto" then decodes with what there is
    assert make(shards, 4, decoder="auto").stats()["decoder"] == "libjpeg-turbo (feeder thread)"


def test_an_unknown_decoder_or_nvjpeg_without_cuda_is_refused(shards: Path, make: MakeLoader):
    with pytest.raises(
        ValueError, match=r"decoder='turbo': choose one of auto, dali, nvimgcodec, nvjpeg, cpu"
    ):
        make(shards, 4, decoder="turbo")
    with pytest.raises(GpufeedError, match=r"decoder='nvjpeg' needs a CUDA device"):
        make(shards, 4, decoder="nvjpeg")


def test_workers_decode_whatever_the_decoder_when_preprocessing_on_cpu(
    shards: Path, make: MakeLoader
):
    loader = make(shards, 4, preprocess="cpu", decoder="nvjpeg")
    assert decoder_name(loader.spec(), loader.device) == workers_decoder_name()
    assert loader.stats()["decoder"] == workers_decoder_name()
