"""Loader throughput: gpufeed vs the classic per-image Pillow DataLoader, and vs the decode-only limit.

Same machine, same images (the embedded photo-like set), same output: 224×224 float32, normalized.
1. baseline: torch DataLoader over `gpufeed.advise.naive.NaiveImageFolder` (per-image Pillow
   decode, random-resized crop, L × (hflip, vflip, rotation), to-tensor, normalize); num_workers = cores;
2. gpufeed Loader on shards packed as-is, and packed with --resize 256; on as-is shards also
   with decoder="nvimgcodec" (workers decode each full-size JPEG over its crop box only), where
   nvImageCodec is installed;
3. decode-only limit: libjpeg-turbo full-size decode of the stored images on all cores.
Augmentation loads: "imagenet" is the ImageNet training recipe (random-resized crop + horizontal
flip: no resampling beyond the resize); L = 1, 12 is the heavy recipe, L × (hflip, vflip, ±15°
rotation), each rotation one bilinear resampling.
Run: python benchmarks/loader_throughput.py [--images 1024] [--loads imagenet 1 12] [--repeats 3]
     [--out FILE.md]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import math
import multiprocessing as mp
import os
import platform
import resource
import statistics
import time
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.utils.data

from gpufeed.advise.naive import NaiveImageFolder
from gpufeed.atomic import write_atomic
from gpufeed.data.augment import Augment
from gpufeed.data.dataset import ShardDataset
from gpufeed.data.loader import Loader
from gpufeed.data.packing import pack
from gpufeed.data.rate import measure_loader
from gpufeed.demo.synth import make_image_folder
from gpufeed.extras import installed

BATCH = 64
SIZE = 224


def _cpu_seconds() -> float:
    """CPU time of this process and of its finished children (the loader workers)."""
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


Run = tuple[float, float, float]  # (first-pass img/s, second-pass img/s, CPU ms per image)


def _time(make: Callable[[], Any], workers: int) -> Run:
    """Two passes over the loader `make()` returns. First pass: images/s from the moment every
    worker has delivered its first batch (the ramp after start-up counts). Second pass: images/s
    over the whole pass, its epoch boundary included (the steady state of a long run). The CPU
    time covers both passes, start-up and worker shutdown included."""
    cpu = _cpu_seconds()
    batches = make()
    warmup = max(1, workers)
    first = measure_loader(
        batches, seconds=math.inf, max_batches=len(batches) - warmup, warmup=warmup
    )
    steady = measure_loader(batches, seconds=math.inf, max_batches=len(batches), warmup=1)
    assert first.batch_shape[1:] == (3, SIZE, SIZE)
    total = 2 * len(batches.dataset)  # each pass delivers every image
    del batches  # joins the workers (gpufeed's persist until their Loader goes), so their
    gc.collect()  # CPU time is counted here
    return first.images_per_s, steady.images_per_s, 1e3 * (_cpu_seconds() - cpu) / total


def recipe(load: str, fused: bool = False) -> Augment:
    """`load` "imagenet": the ImageNet training recipe (random-resized crop, horizontal flip);
    a number L: the heavy recipe, L × (hflip, vflip, rotation) after the crop."""
    if load == "imagenet":
        return Augment(size=(SIZE, SIZE))
    return Augment.load_factor(int(load), size=(SIZE, SIZE), fused=fused)


def baseline(root: Path, load: str, workers: int) -> Run:
    return _time(
        lambda: torch.utils.data.DataLoader(
            NaiveImageFolder(root, recipe(load)),  # type: ignore[arg-type]
            batch_size=BATCH,
            shuffle=True,
            num_workers=workers,
            persistent_workers=True,  # its best case: no re-fork at the second pass
        ),
        workers,
    )


def gpufeed(
    shards: Path,
    load: str,
    workers: int,
    fused: bool = False,
    decoder: str = "auto",
    **options: Any,
) -> Run:
    aug = recipe(load, fused)
    return _time(
        lambda: Loader(shards, BATCH, num_workers=workers, augment=aug, decoder=decoder, **options),
        workers,
    )


def as_is_shards(cache: Path, images: int) -> Path:
    """Shards of `images` embedded photo-like JPEGs packed as-is (their own bytes), made once in
    `cache`."""
    root = make_image_folder(cache / f"images-{images}", images, 10)
    shards = cache / f"shards-{images}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # small shards, below the size advice
        pack(root, shards, progress=False)
    return shards


_DATAS: list[bytes] = []  # the images, loaded before the pool forks so no bytes are sent to it


def _decode_part(part: tuple[int, int]) -> tuple[int, float]:
    import simplejpeg

    cpu = time.process_time()
    for d in _DATAS[part[0] : part[1]]:
        simplejpeg.decode_jpeg(d)
    return part[1] - part[0], time.process_time() - cpu


def decode_limit(shards: Path, workers: int) -> tuple[float, float]:
    """(images/s, CPU ms per image) of libjpeg-turbo full-size decode of every stored image,
    one process per core, nothing else."""
    _DATAS[:] = [s.data for s in ShardDataset(shards, shuffle=False).iter_worker(0, 1)]
    bounds = np.linspace(0, len(_DATAS), workers + 1).astype(int).tolist()
    parts = list(itertools.pairwise(bounds))
    with mp.get_context("fork").Pool(workers) as pool:
        pool.map(_decode_part, [(a, min(b, a + 8)) for a, b in parts])  # warm-up
        t = time.perf_counter()
        done = pool.map(_decode_part, parts, chunksize=1)
        rate = sum(n for n, _ in done) / (time.perf_counter() - t)
    return rate, 1e3 * sum(c for _, c in done) / len(_DATAS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument(
        "--loads",
        nargs="+",
        default=["imagenet", "1", "12"],
        help="augmentation loads: 'imagenet' (crop + flip) or L (L × flip, flip, rotate)",
    )
    ap.add_argument("--cache", type=Path, default=Path(".gpufeed-cache/bench"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    cores = len(os.sched_getaffinity(0))
    torch.set_num_threads(1)
    root = make_image_folder(args.cache / f"images-{args.images}", args.images, 10)
    sizes = [f.stat().st_size for f in root.glob("*/*.jpg")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        asis = args.cache / f"shards-{args.images}"
        small = args.cache / f"shards-{args.images}-r256"
        pack(root, asis, progress=False)
        pack(root, small, resize=256, quality=90, progress=False)
    load_before = os.getloadavg()
    results: dict[tuple[str, int], list[Run]] = {}
    limits: dict[str, list[tuple[float, float]]] = {"as-is": [], "resize 256": []}
    for rep in range(args.repeats):  # interleaved, so background load hits every pipeline alike
        limits["as-is"].append(decode_limit(asis, cores))
        limits["resize 256"].append(decode_limit(small, cores))
        for load in args.loads:
            for name, run in (
                ("baseline (Pillow DataLoader)", partial(baseline, root)),
                ("gpufeed, as-is", partial(gpufeed, asis)),
                ("gpufeed, resize 256", partial(gpufeed, small)),
                ("gpufeed, as-is, fused load", partial(gpufeed, asis, fused=True)),
                ("gpufeed, as-is, crop regions", partial(gpufeed, asis, decoder="nvimgcodec")),
            ):
                if name.endswith("fused load") and not load.isdigit():
                    continue
                if name.endswith("crop regions") and not installed("nvimgcodec"):
                    continue
                results.setdefault((name, load), []).append(run(load=load, workers=cores))
                first, steady, cpu = results[name, load][-1]
                print(
                    f"repeat {rep + 1}: L={load} {name}: {first:.0f} img/s (1st pass), "
                    f"{steady:.0f} img/s (2nd pass), {cpu:.2f} CPU ms/img"
                )
    load_after = os.getloadavg()

    def median(runs: list[tuple[float, ...]]) -> tuple[float, ...]:
        return tuple(statistics.median(col) for col in zip(*runs, strict=True))

    lim = {k: median(v) for k, v in limits.items()}
    lines = [
        f"# loader throughput ({time.strftime('%Y-%m-%d %H:%M')})",
        "",
        f"Hardware: {cores} CPU cores ({platform.processor() or platform.machine()}), no GPU; "
        f"torch {torch.__version__}. Data: {args.images} synthetic photo-like JPEGs "
        f"(mean {np.mean(sizes) / 1e3:.0f} KB, short side 300-500 px; 256 px after --resize). "
        f"Output: {BATCH}×3×224×224 float32, normalized; num_workers = {cores} for every loader. "
        f"Median of {args.repeats} interleaved repeats. Load average (1 min) before/after: "
        f"{load_before[0]:.1f} / {load_after[0]:.1f}.",
        "",
        f"Decode-only limit (libjpeg-turbo, full-size decode, {cores} processes): "
        + ", ".join(f"{k} {r:.0f} img/s ({c:.2f} CPU ms/img)" for k, (r, c) in lim.items())
        + ".",
        "",
        "img/s is wall-clock throughput (depends on what else runs on the machine). 1st pass: "
        "a fresh loader's first pass, clocked once every worker has delivered a batch; 2nd "
        "pass: the next pass's worth of batches on the same loader, its epoch boundary "
        "included (the steady state of a long run; the baseline keeps its workers with "
        "persistent_workers=True). CPU ms/img is the CPU time all processes spent per image "
        "over both passes, start-up and shutdown included (depends much less on background "
        "load). '% of limit' compares with the decode-only limit of the same images (as-is "
        "shards for the baseline): by wall clock, and by CPU time per image (= the throughput "
        "fraction on idle cores).",
        "",
        "| L | pipeline | img/s 1st pass | % of limit | img/s 2nd pass | × baseline "
        "| % of limit | CPU ms/img | × baseline (CPU) | % of limit (CPU) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for load in args.loads:
        _, base_rate, base_cpu = median(results["baseline (Pillow DataLoader)", load])
        for (name, ld), runs in results.items():
            if ld != load:
                continue
            first, rate, cpu = median(runs)
            lim_rate, lim_cpu = lim["resize 256" if "resize" in name else "as-is"]
            lines.append(
                f"| {load} | {name} | {first:.0f} | {100 * first / lim_rate:.0f}% | {rate:.0f} "
                f"| {rate / base_rate:.2f}× | {100 * rate / lim_rate:.0f}% | {cpu:.2f} "
                f"| {base_cpu / cpu:.2f}× | {100 * lim_cpu / cpu:.0f}% |"
            )
    emit(lines, args.out)


def emit(lines: list[str], out: Path | None) -> None:
    """Print the result lines, and write them to `out` if given."""
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        write_atomic(out, text, make_parents=True)


if __name__ == "__main__":
    main()
