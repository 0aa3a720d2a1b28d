"""Decode threads inside a worker: the same batches from fewer processes.

Each CPU worker makes a batch in one native pass (`one_pass`) that releases the GIL, so
`Loader(decode_threads=t)` splits a batch's images over t threads of the worker. On the same
cores the CPU per image stays what it was (threads share the work; they add none), while fewer
processes hold fewer copies of the training process's memory and the loop itself can make its
batches (`num_workers=0`) at the speed of several workers. Baseline: the default, one worker per
core with one thread each. Against it: one worker with one thread, one worker with a thread per
core, no worker with one thread and no worker with a thread per core. Same as-is shards of the
embedded photo-like set and measurements as benchmarks/loader_throughput.py (ImageNet recipe,
batches of 64 float32 on the CPU), the settings alternating round by round; medians.

Run: python benchmarks/decode_threads.py [--images 1024] [--rounds 3] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import torch
from loader_throughput import as_is_shards, emit, gpufeed

from gpufeed.data import jpeg_region


def settings(cores: int) -> dict[str, tuple[int, int]]:
    """name: (num_workers, decode_threads); the first is the baseline."""
    return {
        f"{cores} workers × 1 thread (default, baseline)": (cores, 1),
        "1 worker × 1 thread": (1, 1),
        f"1 worker × {cores} threads": (1, cores),
        "no worker (the loop) × 1 thread": (0, 1),
        f"no worker (the loop) × {cores} threads": (0, cores),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cache", type=Path, default=Path(".gpufeed-cache/bench"))
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if not jpeg_region.one_pass_available():
        raise SystemExit("no one native pass here (no crop-region decoder, or no AVX2)")
    cores = len(os.sched_getaffinity(0))
    torch.set_num_threads(1)
    shards = as_is_shards(args.cache, args.images)
    runs: dict[str, list[tuple[float, float, float]]] = {}
    for r in range(args.rounds):
        for name, (workers, threads) in settings(cores).items():
            run = gpufeed(shards, "imagenet", workers, decode_threads=threads)
            runs.setdefault(name, []).append(run)
            print(
                f"round {r + 1}: {name}: {run[0]:.0f} / {run[1]:.0f} img/s, {run[2]:.2f} CPU ms/img"
            )
    lines = [
        f"# Decode threads ({time.strftime('%Y-%m-%d %H:%M')})",
        "",
        f"Hardware: {cores} CPU cores ({platform.processor() or platform.machine()}), no GPU; "
        f"torch {torch.__version__}. {args.images} embedded photo-like JPEGs, as-is shards, "
        f"ImageNet recipe, 64×3×224×224 float32 on the CPU. Median of {args.rounds} alternating "
        "rounds.",
        "",
        "| workers × decode threads | img/s 1st pass | img/s 2nd pass | CPU ms/img "
        "| × baseline (2nd pass) |",
        "|---|---|---|---|---|",
    ]
    base = None
    for name, done in runs.items():
        first, steady, cpu = (statistics.median(x[i] for x in done) for i in (0, 1, 2))
        base = base or steady
        lines.append(f"| {name} | {first:.0f} | {steady:.0f} | {cpu:.2f} | {steady / base:.2f}× |")
    emit(lines, args.out)


if __name__ == "__main__":
    main()
