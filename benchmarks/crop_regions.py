"""Decoding only the crop box against decoding whole JPEGs, CPU workers.

Baseline: `Loader(decoder="cpu")`, whose workers decode every JPEG whole with libjpeg-turbo
(simplejpeg; DCT-scaled where the crop allows) and then crop. Against it: the default
`decoder="auto"`, whose workers decode only the rows and columns of each JPEG that its
random-resized crop needs (gpufeed's `jpeg_region`: libjpeg-turbo's partial decompression, the
same pixels bit for bit) and, where the load block only flips (the ImageNet recipe), makes each
batch in one native pass (`one_pass`: decode, resize, flip and normalize into the slot), and, where `gpufeed[nvimgcodec]` is installed, `decoder="nvimgcodec"`
(nvImageCodec's CPU backend over the crop box). Same as-is shards of the embedded photo-like set,
same recipes and measurements as benchmarks/loader_throughput.py, the decoders alternating round
by round, with the decode-only limit measured in every round; medians.

Run: python benchmarks/crop_regions.py [--images 1024] [--loads imagenet 1] [--rounds 4] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import torch
from loader_throughput import as_is_shards, decode_limit, emit, gpufeed

from gpufeed.data import jpeg_region
from gpufeed.extras import MissingExtra, require

DECODERS = {
    "cpu": "whole image (baseline)",
    "auto": "crop regions (jpeg_region, default)",
    "nvimgcodec": "nvimgcodec (crop box)",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--loads", nargs="+", default=["imagenet", "1"])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--cache", type=Path, default=Path(".gpufeed-cache/bench"))
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if not jpeg_region.available():
        raise SystemExit("gpufeed was installed without its crop-region decoder (jpeg_region)")
    try:
        require("nvimgcodec")
    except MissingExtra:
        del DECODERS["nvimgcodec"]
    cores = len(os.sched_getaffinity(0))
    torch.set_num_threads(1)
    shards = as_is_shards(args.cache, args.images)
    limits, runs = [], {}
    for r in range(args.rounds):
        limits.append(decode_limit(shards, cores))
        for load in args.loads:
            for decoder in DECODERS:
                runs.setdefault((load, decoder), []).append(
                    gpufeed(shards, load, cores, decoder=decoder)
                )
                first, steady, cpu = runs[load, decoder][-1]
                print(
                    f"round {r + 1}: L={load} {decoder}: {first:.0f} / {steady:.0f} img/s "
                    f"(1st / 2nd pass), {cpu:.2f} CPU ms/img",
                    flush=True,
                )
    lim, lim_cpu = (statistics.median(x[i] for x in limits) for i in (0, 1))
    lines = [
        f"# crop regions ({time.strftime('%Y-%m-%d %H:%M')})",
        "",
        f"Hardware: {cores} CPU cores ({platform.processor() or platform.machine()}), no GPU; "
        f"torch {torch.__version__}. {args.images} embedded photo-like JPEGs, as-is shards, "
        f"num_workers = {cores}, 64×3×224×224 float32. Median of {args.rounds} alternating rounds. "
        f"Decode-only limit: {lim:.0f} img/s ({lim_cpu:.2f} CPU ms/img).",
        "",
        "| L | decoder | img/s 1st pass | % of limit | img/s 2nd pass | % of limit | CPU ms/img "
        "| × whole (CPU) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for load in args.loads:
        base_cpu = statistics.median(x[2] for x in runs[load, "cpu"])
        for decoder, name in DECODERS.items():
            first, steady, cpu = (
                statistics.median(x[i] for x in runs[load, decoder]) for i in (0, 1, 2)
            )
            lines.append(
                f"| {load} | {name} | {first:.0f} | {100 * first / lim:.0f}% | {steady:.0f} "
                f"| {100 * steady / lim:.0f}% | {cpu:.2f} | {base_cpu / cpu:.2f}× |"
            )
    emit(lines, args.out)


if __name__ == "__main__":
    main()
