"""Loader: a drop-in training-loop iterator; exactly-once with ranks × workers, resume, bounded memory."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from gpufeed.data.augment import Augment
from gpufeed.data.batch import CorruptSampleError
from gpufeed.data.loader import Loader
from gpufeed.data.pack import pack

SMALL = Augment(size=(16, 16))


def _epoch(loader: Loader) -> list[int]:
    return [int(x) for _, labels in loader for x in labels]


def test_yields_normalized_float_batches_ready_for_a_model(shards: Path):
    loader = Loader(shards, batch_size=8, num_workers=0, augment=SMALL)
    images, labels = next(iter(loader))
    assert images.shape == (8, 3, 16, 16) and images.dtype == torch.float32
    assert labels.dtype == torch.long and labels.shape == (8,)
    assert -3 < images.mean().item() < 3 and images.std().item() > 0.1


def test_uint8_channels_last_output(shards: Path):
    loader = Loader(shards, 8, num_workers=0, augment=SMALL, dtype=torch.uint8, channels_last=True)
    images, _ = next(iter(loader))
    assert images.dtype == torch.uint8
    assert images.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("workers", [0, 2])
def test_every_sample_exactly_once_per_epoch(shards: Path, world: int, workers: int):
    seen, batches = [], set()
    for rank in range(world):
        loader = Loader(shards, 5, num_workers=workers, augment=SMALL, rank=rank, world_size=world)
        loader.set_epoch(1)
        got = _epoch(loader)
        batches.add(len(loader))
        assert len(got) == 48 // world
        seen += got
    assert sorted(seen) == list(range(48))
    assert len(batches) == 1  # all ranks yield the same number of batches


def test_output_buffers_are_reused_but_never_under_a_batch_still_held(shards: Path):
    loader = Loader(shards, 2, num_workers=2, augment=SMALL, seed=5)
    held, copies = [], []
    for i, (images, _) in enumerate(loader):
        copies.append(images.clone())
        if i % 3 == 0:  # keep every third batch, as a view, the way a user might
            held.append((i, images[1:]))
    assert loader.stats()["reused_buffers"] > 0
    assert all(torch.equal(view, copies[i][1:]) for i, view in held)
    all_held = [x for x, _ in Loader(shards, 2, num_workers=2, augment=SMALL, seed=5)]
    assert len(all_held) == len(copies)  # holding every batch: no reuse possible, same images
    assert all(torch.equal(a, b) for a, b in zip(all_held, copies, strict=True))


def test_resume_mid_epoch_keeps_exactly_once(shards: Path):
    loader = Loader(shards, 4, num_workers=2, augment=SMALL, seed=3)
    loader.set_epoch(2)
    first = []
    for i, (_, labels) in enumerate(loader):
        first += labels.tolist()
        if i == 4:
            state = loader.state_dict()
            break
    resumed = Loader(shards, 4, num_workers=2, augment=SMALL, seed=3)
    resumed.load_state_dict(state)
    rest = _epoch(resumed)
    assert len(first) == 20 and sorted(first + rest) == list(range(48))
    # the resumed part is exactly what the uninterrupted epoch delivers after those batches
    whole = Loader(shards, 4, num_workers=2, augment=SMALL, seed=3)
    whole.set_epoch(2)
    assert sorted(rest) == sorted(_epoch(whole)[20:])


def test_workers_persist_across_epochs_and_follow_set_epoch(shards: Path):
    import psutil

    loader = Loader(shards, 5, num_workers=2, augment=SMALL, seed=4)
    epochs, pids = [], []
    for epoch in (0, 1, 2):
        loader.set_epoch(epoch)
        epochs.append(_epoch(loader))
        pids.append({p.pid for p in psutil.Process().children()})
    assert len(pids[0]) >= 2 and pids[0] == pids[1] == pids[2]  # the same worker processes
    assert all(sorted(e) == list(range(48)) for e in epochs)
    assert epochs[0] != epochs[1] != epochs[2]
    for epoch in (2, 1):  # each epoch's order is what a fresh loader gives for that epoch
        fresh = Loader(shards, 5, num_workers=2, augment=SMALL, seed=4)
        fresh.set_epoch(epoch)
        assert _epoch(fresh) == epochs[epoch]


def test_persistent_workers_resume_mid_epoch_and_go_on_to_the_next(shards: Path):
    loader = Loader(shards, 4, num_workers=2, augment=SMALL, seed=3)
    loader.set_epoch(2)
    first = []
    for i, (_, labels) in enumerate(loader):
        first += labels.tolist()
        if i == 2:
            state = loader.state_dict()
            break
    loader.load_state_dict(state)  # the same loader, its workers still mid-epoch
    rest = _epoch(loader)
    assert len(first) == 12 and sorted(first + rest) == list(range(48))
    loader.set_epoch(3)
    fresh = Loader(shards, 4, num_workers=2, augment=SMALL, seed=3)
    fresh.set_epoch(3)
    assert _epoch(loader) == _epoch(fresh)


def test_buffers_of_abandoned_iterations_are_reused_later(shards: Path):
    loader = Loader(shards, 2, num_workers=2, augment=SMALL, seed=5)
    for _ in range(4):  # each abandons batches the workers had already made
        for _images, _ in loader:
            break
    before = loader.stats()["reused_buffers"]
    _epoch(loader)
    assert loader.stats()["reused_buffers"] - before > 10


def test_resume_with_other_settings_is_refused_with_the_key(shards: Path):
    state = Loader(shards, 4, num_workers=2, augment=SMALL).state_dict()
    with pytest.raises(ValueError, match=r"num_workers=2.*resume with the same num_workers"):
        Loader(shards, 4, num_workers=1, augment=SMALL).load_state_dict(state)


def test_host_memory_cap_bounds_prefetch_or_is_refused(shards: Path):
    big = Loader(shards, 8, num_workers=2, prefetch=8, augment=SMALL)
    cap = big.host_bytes_bound(2)
    capped = Loader(shards, 8, num_workers=2, prefetch=8, augment=SMALL, max_host_bytes=cap)
    assert capped.prefetch == 2 and capped.stats()["host_bytes_bound"] <= cap
    assert sorted(_epoch(capped)) == list(range(48))
    with pytest.raises(ValueError, match="max_host_bytes=1,000 is too small"):
        Loader(shards, 8, num_workers=2, augment=SMALL, max_host_bytes=1000)


@pytest.fixture(scope="module")
def corrupt_shards(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("corrupt_src")
    good = sorted(image_folder.glob("*/*.jpg"))[:10]
    lines = [f"{p} 0" for p in good]
    bad = src / "bad.jpg"
    data = good[0].read_bytes()
    bad.write_bytes(data[: len(data) // 2])  # valid header, truncated scan data
    lines.append("bad.jpg 1")
    (src / "list.txt").write_text("\n".join(lines))
    out = tmp_path_factory.mktemp("corrupt_shards")
    pack(src / "list.txt", out, workers=1, progress=False)
    return out


def test_corrupt_image_is_skipped_counted_and_reported_with_shard_and_key(corrupt_shards: Path):
    loader = Loader(corrupt_shards, 4, num_workers=0, augment=SMALL)
    labels = _epoch(loader)
    assert labels == [0] * 10
    st = loader.stats()
    assert st["corrupt"] == 1
    assert st["corrupt_samples"][0]["key"] == "corrupt_src0_bad"
    assert st["corrupt_samples"][0]["shard"].endswith("shard-00000.tar")


def test_strict_mode_raises_naming_shard_and_key(corrupt_shards: Path):
    loader = Loader(corrupt_shards, 4, num_workers=0, augment=SMALL, strict=True)
    with pytest.raises(CorruptSampleError, match=r"shard .*shard-00000\.tar, key corrupt_src0_bad"):
        _epoch(loader)


def test_gpu_preprocess_path_matches_cpu_path_statistics(shards: Path):
    """preprocess="gpu" on device="cpu" runs the device path (bytes from workers, batched decode
    and augment in this process); it must draw the same augmentations as the CPU workers."""
    aug = Augment(size=(32, 32), load=2)
    out = {}
    for mode in ("cpu", "gpu"):
        loader = Loader(
            shards, 8, num_workers=2, augment=aug, preprocess=mode, device="cpu", seed=1
        )
        batches = list(loader)
        x = torch.cat([b[0] for b in batches])
        out[mode] = (x, torch.cat([b[1] for b in batches]))
        assert loader.stats()["preprocess"] == mode
    (xc, yc), (xg, yg) = out["cpu"], out["gpu"]
    assert xc.shape == xg.shape and xc.dtype == xg.dtype
    assert torch.equal(yc, yg)
    torch.testing.assert_close(xc.mean((0, 2, 3)), xg.mean((0, 2, 3)), atol=1e-3, rtol=0)
    torch.testing.assert_close(xc.std((0, 2, 3)), xg.std((0, 2, 3)), atol=1e-3, rtol=0)


def test_auto_picks_cpu_without_a_gpu(shards: Path):
    if torch.cuda.is_available():
        pytest.skip("CPU-only behaviour")
    loader = Loader(shards, 8, num_workers=0, augment=SMALL, preprocess="auto")
    assert loader.preprocess == "cpu" and "no CUDA" in loader.stats()["preprocess_reason"]


def test_unknown_preprocess_mode_is_refused(shards: Path):
    with pytest.raises(ValueError, match="preprocess='tpu': choose one of cpu, gpu, auto"):
        Loader(shards, preprocess="tpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_preprocess_on_cuda_delivers_device_batches(shards: Path):
    loader = Loader(shards, 8, num_workers=2, augment=SMALL, preprocess="gpu", device="cuda")
    labels = []
    for images, lab in loader:
        assert images.is_cuda and lab.is_cuda
        labels += lab.tolist()
    assert sorted(labels) == list(range(48))
    assert loader.stats()["device_max_allocated"] > 0


def test_torchrun_ranks_split_the_data_exactly_once(shards: Path, tmp_path: Path):
    """Two real torchrun processes (gloo): rank auto-detected from torch.distributed."""
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(f"""
        import torch.distributed as dist
        from gpufeed.data.augment import Augment
        from gpufeed.data.loader import Loader
        dist.init_process_group("gloo")
        loader = Loader({str(shards)!r}, 6, num_workers=1, augment=Augment(size=(8, 8)))
        labels = [int(x) for _, y in loader for x in y]
        open({str(tmp_path)!r} + f"/rank{{dist.get_rank()}}.txt", "w").write(
            f"{{len(loader)}} " + " ".join(map(str, labels)))
        dist.destroy_process_group()
        """)
    )
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(port), str(script)]  # fmt: skip
    cp = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert cp.returncode == 0, cp.stderr[-3000:]
    parts = [(tmp_path / f"rank{r}.txt").read_text().split() for r in range(2)]
    assert parts[0][0] == parts[1][0]  # same number of batches
    labels = [int(x) for p in parts for x in p[1:]]
    assert sorted(labels) == list(range(48))
