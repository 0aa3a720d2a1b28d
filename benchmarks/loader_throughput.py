"""Loader throughput: gpufeed vs the classic per-image Pillow DataLoader, and vs the decode-only limit.

Same machine, same images (the embedded photo-like set), same output: 224×224 float32, normalized.
1. baseline: torch DataLoader over `gpufeed.advise.naive.NaiveImageFolder` (per-image Pillow
   decode, random-resized crop, L × (hflip, vflip, rotation), to-tensor, normalize); num_workers = cores;
2. gpufeed Loader on shards packed as-is, and packed with --resize 256;
3. decode-only limit: libjpeg-turbo full-size decode of the stored images on all cores.
Run: python benchmarks/loader_throughput.py [--images 1024] [--repeats 3] [--out FILE.md]
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

BATCH = 64
SIZE = 224


def _cpu_seconds() -> float:
    """CPU time of this process and of its finished children (the loader workers)."""
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _time(make: Callable[[], Any], workers: int) -> tuple[float, float]:
    """(images/s in steady state, CPU ms per image) over one pass of the loader `make()` returns.
    The clock starts when every worker has delivered its first batch; the CPU time covers the
    whole pass, start-up and worker shutdown included."""
    cpu = _cpu_seconds()
    batches = make()
    warmup = max(1, workers)
    rate = measure_loader(
        batches, seconds=math.inf, max_batches=len(batches) - warmup, warmup=warmup
    )
    assert rate.batch_shape[1:] == (3, SIZE, SIZE)
    total = len(batches.dataset)  # one pass delivers every image
    del batches  # joins the workers (gpufeed's persist until their Loader goes), so their
    gc.collect()  # CPU time is counted here
    return rate.images_per_s, 1e3 * (_cpu_seconds() - cpu) / total


def baseline(root: Path, load: int, workers: int) -> tuple[float, float]:
    return _time(
        lambda: torch.utils.data.DataLoader(
            NaiveImageFolder(root, Augment.load_factor(load, size=(SIZE, SIZE))),  # type: ignore[arg-type]
            batch_size=BATCH,
            shuffle=True,
            num_workers=workers,
        ),
        workers,
    )


def gpufeed(shards: Path, load: int, workers: int, fused: bool = False) -> tuple[float, float]:
    aug = Augment.load_factor(load, size=(SIZE, SIZE), fused=fused)
    return _time(lambda: Loader(shards, BATCH, num_workers=workers, augment=aug), workers)


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
    ap.add_argument("--loads", type=int, nargs="+", default=[1, 12])
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
    results: dict[tuple[str, int], list[tuple[float, float]]] = {}
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
            ):
                results.setdefault((name, load), []).append(run(load=load, workers=cores))
                rate, cpu = results[name, load][-1]
                print(f"repeat {rep + 1}: L={load} {name}: {rate:.0f} img/s, {cpu:.2f} CPU ms/img")
    load_after = os.getloadavg()

    def median(runs: list[tuple[float, float]]) -> tuple[float, float]:
        return statistics.median(r for r, _ in runs), statistics.median(c for _, c in runs)

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
        "img/s is wall-clock throughput (depends on what else runs on the machine); CPU ms/img "
        "is the CPU time all processes spent per image, start-up included (depends much less "
        "on background load). '% of limit' compares with the decode-only limit of the same "
        "images (as-is shards for the baseline): by wall clock, and by CPU time per image "
        "(= the throughput fraction on idle cores).",
        "",
        "| L | pipeline | img/s | × baseline | % of limit (img/s) | CPU ms/img "
        "| × baseline (CPU) | % of limit (CPU) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for load in args.loads:
        base_rate, base_cpu = median(results["baseline (Pillow DataLoader)", load])
        for (name, ld), runs in results.items():
            if ld != load:
                continue
            rate, cpu = median(runs)
            lim_rate, lim_cpu = lim["resize 256" if "resize" in name else "as-is"]
            lines.append(
                f"| {load} | {name} | {rate:.0f} | {rate / base_rate:.2f}× "
                f"| {100 * rate / lim_rate:.0f}% | {cpu:.2f} | {base_cpu / cpu:.2f}× "
                f"| {100 * lim_cpu / cpu:.0f}% |"
            )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        write_atomic(args.out, text, make_parents=True)


if __name__ == "__main__":
    main()
