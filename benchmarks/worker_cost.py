"""CPU time a loader worker spends per image, by hand-off: what `decoder="workers"` saves the CPU.

Baseline: the CPU path (`preprocess="cpu"`): a worker decodes (libjpeg-turbo, DCT-scaled), crops,
resizes and applies the whole load block, L × (hflip, vflip, ±15° rotation), each rotation one
bilinear resampling. Against it: `preprocess="gpu", decoder="workers"`: the worker stops after the
first warp (done in the same resampling as the crop and resize) and leaves the other L - 1 to the
device. Both make the same batches (`build_batch`, the function the workers run) from the same
samples of the embedded photo-like set, in this one process, on one thread, one image at a time,
interleaved; CPU time by `time.process_time`, median of the repeats. The device's share is not
measured here (it needs a GPU: `benchmarks/gpu_feed.py` has the `decoder="workers"` rows).

Run: python benchmarks/worker_cost.py [--images 256] [--loads 1 4 12] [--repeats 3] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch

from gpufeed.atomic import write_atomic
from gpufeed.data.augment import Augment
from gpufeed.data.batch import batch_generator, build_batch
from gpufeed.data.dataset import RawSample, ShardDataset
from gpufeed.data.packing import pack
from gpufeed.demo.synth import make_image_folder
from gpufeed.hardware import describe, hardware

BATCH = 64
SIZE = 224


def samples(n: int, work: Path) -> list[RawSample]:
    """`n` photo-like JPEGs (short side 300-500 px), packed as-is and read back as raw samples."""
    folder = make_image_folder(work / "images", n, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tiny shards, below the 1-128 MB advice
        pack(folder, work / "shards", progress=False)
    return list(ShardDataset(work / "shards", shuffle=False).iter_worker(0, 1))


def cpu_ms_per_image(raw: list[RawSample], aug: Augment, device_warps: bool) -> float:
    """CPU ms per image for a worker to fill uint8 batches of `raw`, as the hand-off asks."""
    t = time.process_time()
    for j in range(0, len(raw), BATCH):
        rest: list[torch.Tensor] | None = [] if device_warps else None
        gen = batch_generator(0, 0, 0, j)
        build_batch(
            raw[j : j + BATCH], aug, gen, dtype=torch.uint8, channels_last=True, strict=True,
            rest=rest,
        )  # fmt: skip
    return 1e3 * (time.process_time() - t) / len(raw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--loads", type=int, nargs="+", default=[1, 4, 12])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)  # one worker process: one core
    with tempfile.TemporaryDirectory(prefix="gpufeed-worker-cost-") as tmp:
        raw = samples(args.images, Path(tmp))
        rows = []
        for load in args.loads:
            aug = Augment.load_factor(load, size=(SIZE, SIZE))
            cpu_path, workers = [], []
            cpu_ms_per_image(raw[:BATCH], aug, False)  # warm-up: allocator, caches
            for _ in range(args.repeats):
                cpu_path.append(cpu_ms_per_image(raw, aug, False))
                workers.append(cpu_ms_per_image(raw, aug, True))
            base, split = statistics.median(cpu_path), statistics.median(workers)
            rows.append((load, base, split, base / split))
            print(f"L={load}: CPU path {base:.2f} ms/img, decoder='workers' {split:.2f} ms/img")
    lines = [
        f"Hardware: {describe(hardware())}; one thread. Data: {args.images} photo-like JPEGs "
        f"(short side 300-500 px), output {SIZE}×{SIZE}, batches of {BATCH}, median of {args.repeats}.",
        "",
        "| L | CPU path: worker CPU ms/img | decoder='workers': worker CPU ms/img | CPU path ÷ workers |",
        "|---|---|---|---|",
        *(f"| {load} | {b:.2f} | {s:.2f} | {r:.2f}× |" for load, b, s, r in rows),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        write_atomic(args.out, text.encode())


if __name__ == "__main__":
    main()
