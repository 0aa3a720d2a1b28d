"""CPU time per image of each step a loader worker takes, whole-JPEG decoding against crop regions.

Baseline: a worker as with `Loader(decoder="cpu")`: read the header, decode the whole JPEG
(simplejpeg, DCT-scaled where the crop allows), crop and resize (antialiased), flip, normalize
into the float32 batch. Against it: the default, `jpeg_region`'s decode of the crop's rows and
columns only, then the same steps. Each step is timed on its own over the same images and the
same random-resized crops (ImageNet recipe, 224², batches of 32), one thread, CPU time of this
thread (`time.thread_time`), median of the rounds; then `build_batch`, the function a worker runs,
whole, with each decoder: whole JPEGs, crop regions then torch's steps image by image, and the
default, one native pass per batch (`one_pass`: region decoded, resized, flipped and normalized
into the batch); the one pass is timed on its own too, into a uint8 slot and into a float32
batch. Data: the embedded photo-like set, as-is (full size) and pre-resized to a short side of 256.

Run: python benchmarks/image_steps.py [--images 512] [--rounds 5] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from loader_throughput import emit

from gpufeed.data import jpeg_region, one_pass
from gpufeed.data.augment import Augment
from gpufeed.data.batch import batch_generator, build_batch, cpu_decoder
from gpufeed.data.dataset import RawSample, ShardDataset
from gpufeed.data.decode import decode, image_size
from gpufeed.data.packing import pack
from gpufeed.demo.synth import make_image_folder
from gpufeed.hardware import describe, hardware

BATCH = 32


def samples(root: Path, n: int, resize: int | None) -> list[RawSample]:
    """`n` photo-like JPEGs packed (as-is, or pre-resized) and read back."""
    folder = make_image_folder(root / f"images-{n}", n, 10)
    shards = root / f"shards-{n}-{resize or 'full'}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tiny shards, below the size advice
        pack(folder, shards, resize=resize, progress=False)
    return list(ShardDataset(shards, shuffle=False).iter_worker(0, 1))


def ms_per_image(step: Callable[[], object], n: int) -> float:
    t = time.thread_time()
    step()
    return 1e3 * (time.thread_time() - t) / n


def batches(raw: list[RawSample], aug: Augment) -> dict[str, Callable[[], object]]:
    """`build_batch` over all images, batch by batch, with each decoder. Timed before `steps`
    holds every decoded image in memory: a worker's allocator reuses its few batches' memory."""

    def run(decoder: Callable[..., list]) -> Callable[[], object]:
        def make() -> None:
            for j in range(0, len(raw), BATCH):
                gen = batch_generator(0, 0, 0, j)
                build_batch(
                    raw[j : j + BATCH], aug, gen, dtype=torch.float32, channels_last=False,
                    strict=True, decoder=decoder,
                )  # fmt: skip

        return make

    steps_alone = jpeg_region.CropDecoder()
    steps_alone.fill = None  # crop regions, then torch's steps image by image
    return {
        "build_batch, whole JPEGs (baseline)": run(cpu_decoder),
        "build_batch, crop regions, steps image by image": run(steps_alone),
        "build_batch, one native pass": run(jpeg_region.crop_decoder),
    }


def steps(raw: list[RawSample], aug: Augment) -> dict[str, Callable[[], object]]:
    """Each step over all images, as a worker takes it, with the crops a worker draws."""
    datas = [s.data for s in raw]
    sizes = [image_size(d) for d in datas]
    boxes, flips = [], []
    for j in range(0, len(raw), BATCH):
        gen = batch_generator(0, 0, 0, j)
        boxes += aug.boxes(sizes[j : j + BATCH], gen)
        flips += aug.warps(aug.flips_and_angles(len(sizes[j : j + BATCH]), gen))[0].unbind(0)
    mins = [aug.min_decode_size(s, b) for s, b in zip(sizes, boxes, strict=True)]
    whole = [torch.from_numpy(decode(d, *m)) for d, m in zip(datas, mins, strict=True)]
    regions = [
        torch.from_numpy(jpeg_region.decode_box(d, s, b, m))
        for d, s, b, m in zip(datas, sizes, boxes, mins, strict=True)
    ]
    resized = [
        aug.first_pass(im, s, b, [], 0) for im, s, b in zip(whole, sizes, boxes, strict=True)
    ]
    out = torch.empty((1, 3, *aug.size))
    plans = [
        one_pass.plan(
            sizes[j : j + BATCH], boxes[j : j + BATCH], mins[j : j + BATCH],
            np.array([[int(t[0, 0] < 0), 0] for t in flips[j : j + BATCH]], np.int32),
            jpeg_region.dct_scale,
        )
        for j in range(0, len(raw), BATCH)
    ]  # fmt: skip

    def native(dtype: torch.dtype, last: bool) -> Callable[[], object]:
        shape = (BATCH, *aug.size, 3) if last else (BATCH, 3, *aug.size)
        batch = torch.empty(shape, dtype=dtype)
        slot = batch.permute(0, 3, 1, 2) if last else batch

        def run() -> None:
            for k, rows in enumerate(plans):
                chunk = datas[k * BATCH : (k + 1) * BATCH]
                one_pass.fill(aug, chunk, rows, slot[: len(chunk)], jpeg_region.EDGE)

        return run

    def finish() -> None:
        for x, theta in zip(resized, flips, strict=True):
            aug.finish(x.flip(-1) if theta[0, 0] < 0 else x, [], out, owned=True)

    return {
        "header": lambda: [image_size(d) for d in datas],
        "decode, whole JPEG (baseline)": lambda: [
            decode(d, *m) for d, m in zip(datas, mins, strict=True)
        ],
        "decode, crop region": lambda: [
            jpeg_region.decode_box(d, s, b, m)
            for d, s, b, m in zip(datas, sizes, boxes, mins, strict=True)
        ],
        "crop + resize, from a whole decode": lambda: [
            aug.first_pass(im, s, b, [], 0) for im, s, b in zip(whole, sizes, boxes, strict=True)
        ],
        "crop + resize, from a crop region": lambda: [
            aug.first_pass(im, (b[2], b[3]), (0, 0, b[2], b[3]), [], 0)
            for im, b in zip(regions, boxes, strict=True)
        ],
        "flip + normalize into the float32 batch": finish,
        "one pass: region decoded, resized, flipped into a uint8 N×H×W×3 slot": native(
            torch.uint8, True
        ),
        "one pass: the same, normalized into a float32 N×3×H×W batch": native(torch.float32, False),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cache", type=Path, default=Path(".gpufeed-cache/bench"))
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if not jpeg_region.available():
        raise SystemExit("gpufeed was installed without its crop-region decoder (jpeg_region)")
    torch.set_num_threads(1)
    aug = Augment()
    lines = [
        f"# CPU per image, step by step ({time.strftime('%Y-%m-%d %H:%M')})",
        "",
        f"Hardware: {describe(hardware())}; one thread. {args.images} embedded photo-like JPEGs, "
        f"ImageNet recipe (random-resized crop to 224², flip), batches of {BATCH}; CPU ms per "
        f"image, median of {args.rounds} rounds [min–max].",
        "",
        "| step | full size | pre-resized 256 |",
        "|---|---|---|",
    ]
    table: dict[str, list[str]] = {}
    for resize in (None, 256):
        raw = samples(args.cache, args.images, resize)
        times: dict[str, list[float]] = {}
        for make in (batches, steps):  # whole batches first, then step by step
            work = make(raw, aug)
            for _ in range(args.rounds):
                for name, step in work.items():
                    times.setdefault(name, []).append(ms_per_image(step, args.images))
            del work
        for name, ts in times.items():
            table.setdefault(name, []).append(
                f"{statistics.median(ts):.3f} [{min(ts):.3f}–{max(ts):.3f}]"
            )
        base = statistics.median(times["build_batch, whole JPEGs (baseline)"])
        for name in ("crop regions, steps image by image", "one native pass"):
            new = statistics.median(times[f"build_batch, {name}"])
            print(f"{resize or 'full size'}: build_batch whole ÷ {name} = {base / new:.2f}×")
            table.setdefault(f"build_batch: whole ÷ {name}", []).append(f"{base / new:.2f}×")
    lines += [f"| {name} | {' | '.join(cells)} |" for name, cells in table.items()]
    emit(lines, args.out)


if __name__ == "__main__":
    main()
