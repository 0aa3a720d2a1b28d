"""The Loader's other paths to the same batches: preprocess="gpu" (encoded hand-off, decoded by
the device stage), decoder="workers" (workers decode and crop, the device warps), each device
decoder on CUDA, the choice of preprocessing, and the feeder's threads on a CPU device.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from loader_helpers import (
    AUG,
    UINT8_TOL,
    MakeLoader,
    _bad_batch,
    _batches,
    _cpu_batch,
    _epoch,
    _planned,
    gpu,
    needs_cuda,
    workers_decoder_name,
)

from gpufeed.data.augment import Augment
from gpufeed.data.dali import dali_importable
from gpufeed.data.device import nvjpeg_available
from gpufeed.data.loader import Loader

# --- preprocess="gpu": encoded hand-off, decoded on the feeder thread without CUDA --------------


@pytest.mark.parametrize("num_workers", [0, 2])
def test_gpu_preprocess_on_cpu_gives_the_batches_of_the_cpu_path(
    shards: Path, make: MakeLoader, num_workers: int
):
    out, decoders = {}, {}
    for mode in ("cpu", "gpu"):
        loader = make(shards, 8, num_workers=num_workers, augment=AUG, preprocess=mode, seed=1)
        loader.set_epoch(2)
        out[mode] = _batches(loader)
        decoders[mode] = loader.stats()["decoder"]
        assert loader.stats()["preprocess"] == mode
    assert [y for _, y in out["cpu"]] == [y for _, y in out["gpu"]]
    for (xc, _), (xg, _) in zip(out["cpu"], out["gpu"], strict=True):
        assert xc.shape == xg.shape and xc.dtype == xg.dtype == torch.float32
        assert (xc - xg).abs().max() <= UINT8_TOL
    assert decoders["gpu"] == "libjpeg-turbo (feeder thread)"
    assert decoders["cpu"] == workers_decoder_name(AUG)
    # the encoded path does not round: it is the float batch of build_batch
    planned = _planned(shards, 2, 8, num_workers, seed=1)
    want, _, _ = _cpu_batch(planned[3], 2, 3, torch.float32)
    torch.testing.assert_close(out["gpu"][3][0], want, atol=1e-5, rtol=0)


def test_gpu_preprocess_of_shards_indexed_without_image_sizes_keeps_every_image(
    shards: Path, make: MakeLoader, tmp_path: Path
):
    # a version-1 index has no image sizes: its encoded slots were sized for 1 KiB images, and
    # the larger ones were dropped as "unreadable image header"
    from indexes import legacy_copy

    d = legacy_copy(shards, tmp_path / "v1")
    loader = make(d, 8, num_workers=2, preprocess="gpu")
    assert sorted(_epoch(loader)) == list(range(48)) and loader.stats()["corrupt"] == 0


# --- preprocess="gpu", decoder="workers": workers decode and crop, the device warps -------------


@pytest.mark.parametrize("num_workers", [0, 2])
def test_workers_decoding_for_the_device_gives_the_batches_of_the_cpu_path(
    shards: Path, make: MakeLoader, num_workers: int
):
    """Workers hand over the first warp's uint8 result and the later warps' matrices; the device
    stage applies those: the CPU path's batch up to the one uint8 rounding after the first warp."""
    out = {}
    for mode, decoder in (("cpu", "auto"), ("gpu", "workers")):
        loader = make(
            shards,
            8,
            num_workers=num_workers,
            augment=AUG,
            preprocess=mode,
            decoder=decoder,
            seed=1,
        )
        loader.set_epoch(2)
        out[mode] = _batches(loader)
        st = loader.stats()
        assert (st["preprocess"], st["decoder"]) == (mode, workers_decoder_name(AUG))
    assert [y for _, y in out["cpu"]] == [y for _, y in out["gpu"]]
    for (xc, _), (xg, _) in zip(out["cpu"], out["gpu"], strict=True):
        assert xc.shape == xg.shape and xg.dtype == torch.float32
        assert (xc - xg).abs().max() <= UINT8_TOL
    # the device stage did warp: the workers' first pass alone is another batch
    first_only = make(
        shards, 8, num_workers=num_workers, augment=Augment.load_factor(1, size=(32, 32)), seed=1
    )
    first_only.set_epoch(2)
    assert (out["gpu"][0][0] - _batches(first_only)[0][0]).abs().max() > 0.5


def test_the_slot_carries_one_matrix_per_warp_after_the_first(shards: Path, make: MakeLoader):
    for aug, columns in (
        (Augment.load_factor(3, size=(16, 16)), 12),
        (Augment.load_factor(3, size=(16, 16), fused=True), 0),
        (Augment.load_factor(1, size=(16, 16)), 0),
        (Augment(size=(16, 16), train=False), 0),
    ):
        spec = make(
            shards, 4, num_workers=0, preprocess="gpu", decoder="workers", augment=aug
        ).spec()
        assert (spec.handoff, spec.param_columns) == ("first_pass", columns)
        assert spec.slot_bytes == spec.image_bytes + 8 * 4 + 8 * 4 * columns


def test_with_workers_decoding_a_corrupt_image_leaves_the_others_their_warps(
    corrupt_shards: Path, make: MakeLoader
):
    aug = Augment.load_factor(2, size=(16, 16))
    got = {}
    for mode, decoder in (("cpu", "auto"), ("gpu", "workers")):
        loader = make(
            corrupt_shards, 4, num_workers=2, preprocess=mode, decoder=decoder, augment=aug
        )
        got[mode] = _batches(loader)
        assert loader.stats()["corrupt"] == 1
    bad = _bad_batch(corrupt_shards, 2)
    (xc, yc), (xg, yg) = got["cpu"][bad], got["gpu"][bad]
    assert yc == yg and len(yg) == 3
    assert (xc - xg).abs().max() <= 0.5 / 255 / min(aug.std) + 1e-4


# --- choosing the preprocessing -----------------------------------------------------------------


def test_auto_picks_cpu_without_a_gpu(shards: Path, make: MakeLoader):
    if torch.cuda.is_available():
        pytest.skip("CPU-only behaviour")
    loader = make(shards, 8, num_workers=0, preprocess="auto", device=None)
    assert loader.preprocess == "cpu" and "no CUDA" in loader.stats()["preprocess_reason"]


# --- a CPU device -------------------------------------------------------------------------------


@pytest.mark.parametrize("preprocess", ["cpu", "gpu"])
def test_on_a_cpu_device_the_feeder_converts_on_one_thread_and_leaves_the_loops_threads(
    shards: Path, monkeypatch: pytest.MonkeyPatch, preprocess: str
):
    from gpufeed.data.device import threads_are_per_thread

    calls = []  # (thread name, threads asked for), recorded on the way to torch
    set_threads = torch.set_num_threads

    def recording(n: int) -> None:
        calls.append((threading.current_thread().name, n))
        set_threads(n)

    monkeypatch.setattr(torch, "set_num_threads", recording)
    before = torch.get_num_threads()
    aug = Augment(size=(16, 16))
    with Loader(shards, 4, num_workers=1, augment=aug, preprocess=preprocess) as loader:
        batches = [x for x, _ in loader]
    assert batches and batches[0].dtype == torch.float32
    # workers that finished the batches: no OpenMP threads woken for converting them in the
    # training process, beside the workers (a device stage that decodes keeps its threads); the
    # training thread's own setting (a CPU model's threads) is as it was
    one = preprocess == "cpu" and threads_are_per_thread()
    assert calls == ([("gpufeed-feeder", 1)] if one else [])
    assert torch.get_num_threads() == before


# --- CUDA ---------------------------------------------------------------------------------------


@gpu
@needs_cuda
def test_cuda_batches_match_the_cpu_batches(shards: Path, make: MakeLoader):
    out = {}
    for device in ("cpu", "cuda"):
        loader = make(shards, 8, num_workers=2, augment=AUG, device=device, channels_last=True)
        out[device] = _batches(loader)
        assert loader.stats()["pinned"] == (device == "cuda")
    for (xc, yc), (xg, yg) in zip(out["cpu"], out["cuda"], strict=True):
        assert xg.is_cuda and xg.is_contiguous(memory_format=torch.channels_last)
        assert yc == yg
        assert (xg.cpu() - xc).abs().max() <= UINT8_TOL  # uint8 hand-off to CUDA rounds


@gpu
@needs_cuda
def test_gpu_preprocess_on_cuda_delivers_device_batches(shards: Path, make: MakeLoader):
    loader = make(shards, 8, num_workers=2, augment=AUG, preprocess="gpu", device="cuda", seed=1)
    batches = []
    for images, labels in loader:
        assert images.is_cuda and labels.is_cuda
        batches.append((images, labels))
    assert sorted(torch.cat([y for _, y in batches]).tolist()) == list(range(48))
    st = loader.stats()
    assert st["device_max_allocated"] > 0
    nvjpeg = "nvjpeg (torchvision)" if nvjpeg_available() else "libjpeg-turbo (feeder thread)"
    assert st["decoder"] == ("dali (mixed)" if dali_importable() else nvjpeg)  # decoder="auto"
    cpu = make(shards, 8, num_workers=2, augment=AUG, preprocess="cpu", device="cpu", seed=1)
    xc = torch.cat([x for x, _ in cpu])
    xg = torch.cat([x for x, _ in batches]).cpu()
    # other decoder and resampling: the same crops and flips, so close statistics
    torch.testing.assert_close(xg.mean((0, 2, 3)), xc.mean((0, 2, 3)), atol=0.05, rtol=0)
    torch.testing.assert_close(xg.std((0, 2, 3)), xc.std((0, 2, 3)), atol=0.05, rtol=0)


@gpu
@needs_cuda
@pytest.mark.parametrize(
    ("decoder", "name"),
    [
        ("nvjpeg", "nvjpeg (torchvision)"),
        ("nvimgcodec", "nvimgcodec (cuda)"),
        ("dali", "dali (mixed)"),
        ("cpu", "libjpeg-turbo (feeder thread)"),
    ],
)
def test_each_device_decoder_on_cuda_gives_the_images_of_the_cpu_path(
    decoder: str, name: str, shards: Path, make: MakeLoader
):
    if decoder in ("nvimgcodec", "dali"):
        pytest.importorskip(f"nvidia.{decoder}")
    if decoder == "nvjpeg" and not nvjpeg_available():
        pytest.skip("needs torchvision's nvJPEG")
    kw: dict[str, Any] = {"num_workers": 2, "augment": AUG, "seed": 1}
    loader = make(shards, 8, preprocess="gpu", device="cuda", decoder=decoder, **kw)
    batches = [(x.cpu(), y.cpu()) for x, y in loader]  # 6 batches: decode buffers reused
    assert loader.stats()["decoder"] == name
    assert sorted(torch.cat([y for _, y in batches]).tolist()) == list(range(48))
    cpu = make(shards, 8, preprocess="cpu", device="cpu", **kw)
    xc = torch.cat([x for x, _ in cpu])
    xg = torch.cat([x for x, _ in batches])
    # another decoder and resampling: the same crops and flips, so close statistics
    torch.testing.assert_close(xg.mean((0, 2, 3)), xc.mean((0, 2, 3)), atol=0.05, rtol=0)
    torch.testing.assert_close(xg.std((0, 2, 3)), xc.std((0, 2, 3)), atol=0.05, rtol=0)


@gpu
@needs_cuda
def test_workers_decoding_for_cuda_matches_the_cpu_batches(shards: Path, make: MakeLoader):
    out = {}
    for device, mode in (("cpu", "cpu"), ("cuda", "gpu")):
        loader = make(
            shards, 8, num_workers=2, augment=AUG, device=device, preprocess=mode,
            decoder="workers", channels_last=True, seed=1,
        )  # fmt: skip
        out[device] = _batches(loader)
        assert loader.stats()["pinned"] == (device == "cuda")
    for (xc, yc), (xg, yg) in zip(out["cpu"], out["cuda"], strict=True):
        assert xg.is_cuda and xg.is_contiguous(memory_format=torch.channels_last) and yc == yg
        assert (xg.cpu() - xc).abs().max() <= UINT8_TOL + 1e-3  # GPU bilinear: float rounding
