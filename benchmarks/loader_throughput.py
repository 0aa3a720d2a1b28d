"""Loader throughput: gpufeed vs the classic per-image Pillow DataLoader, and vs the decode-only limit.

Same machine, same images (the embedded photo-like set), same output: 224×224 float32, normalized.
1. baseline: torch DataLoader over the image folder, per-image Pillow decode, random-resized crop,
   L × (hflip, vflip, rotation), to-tensor, normalize; num_workers = cores;
2. gpufeed Loader on shards packed as-is, and packed with --resize 256;
3. decode-only limit: libjpeg-turbo full-size decode of the stored images on all cores.
Run: python benchmarks/loader_throughput.py [--images 1024] [--out benchmarks/results/loader_throughput.md]
"""

from __future__ import annotations

import argparse
import itertools
import math
import multiprocessing as mp
import os
import platform
import random
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.utils.data
from PIL import Image

from gpufeed.bench.synth import make_image_folder
from gpufeed.data.augment import IMAGENET_MEAN, IMAGENET_STD, Augment
from gpufeed.data.dataset import ShardDataset
from gpufeed.data.loader import Loader
from gpufeed.data.pack import pack

BATCH = 64
SIZE = 224


class PillowFolder(torch.utils.data.Dataset):
    """The classic pipeline, what torchvision's PIL transforms do, one image at a time."""

    def __init__(self, root: Path, load: int) -> None:
        self.files = sorted(root.glob("*/*.jpg"))
        self.classes = sorted({f.parent.name for f in self.files})
        self.load = load
        self.mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
        self.std = torch.tensor(IMAGENET_STD).view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        f = self.files[i]
        im = Image.open(f).convert("RGB")
        w, h = im.size
        for _ in range(10):  # RandomResizedCrop(224, scale=(0.08, 1), ratio=(3/4, 4/3))
            area = w * h * random.uniform(0.08, 1.0)
            r = math.exp(random.uniform(math.log(3 / 4), math.log(4 / 3)))
            cw, ch = round(math.sqrt(area * r)), round(math.sqrt(area / r))
            if 0 < cw <= w and 0 < ch <= h:
                x, y = random.randint(0, w - cw), random.randint(0, h - ch)
                break
        else:
            cw, ch, x, y = min(w, h), min(w, h), (w - min(w, h)) // 2, (h - min(w, h)) // 2
        im = im.resize((SIZE, SIZE), Image.BILINEAR, box=(x, y, x + cw, y + ch))
        for _ in range(self.load):
            if random.random() < 0.5:
                im = im.transpose(Image.FLIP_LEFT_RIGHT)
            if random.random() < 0.5:
                im = im.transpose(Image.FLIP_TOP_BOTTOM)
            im = im.rotate(random.uniform(-15, 15), resample=Image.BILINEAR)
        t = torch.from_numpy(np.array(im)).permute(2, 0, 1).float().div_(255)
        return (t - self.mean) / self.std, self.classes.index(f.parent.name)


def _time(batches: object, workers: int) -> float:
    """Images/s over one pass in steady state: the clock starts when every worker has delivered
    its first batch (worker start-up and the first decode are not counted)."""
    n, t0, seen = 0, None, 0
    for images, _ in batches:  # type: ignore[attr-defined]
        assert images.shape[1:] == (3, SIZE, SIZE) and images.dtype == torch.float32
        seen += 1
        if t0 is None:
            if seen >= max(1, workers):
                t0 = time.perf_counter()
            continue
        n += len(images)
    return n / (time.perf_counter() - t0)


def baseline(root: Path, load: int, workers: int) -> float:
    dl = torch.utils.data.DataLoader(
        PillowFolder(root, load), batch_size=BATCH, shuffle=True, num_workers=workers
    )
    return _time(dl, workers)


def gpufeed(shards: Path, load: int, workers: int, fused: bool = False) -> float:
    aug = Augment(size=(SIZE, SIZE), load=load, fused=fused)
    return _time(Loader(shards, BATCH, num_workers=workers, augment=aug), workers)


_DATAS: list[bytes] = []  # the images, loaded before the pool forks so no bytes are sent to it


def _decode_part(part: tuple[int, int]) -> int:
    import simplejpeg

    for d in _DATAS[part[0] : part[1]]:
        simplejpeg.decode_jpeg(d)
    return part[1] - part[0]


def decode_limit(shards: Path, workers: int) -> float:
    """libjpeg-turbo full-size decode of every stored image, one process per core, nothing else."""
    _DATAS[:] = [s.data for s in ShardDataset(shards, shuffle=False).iter_worker(0, 1)]
    bounds = np.linspace(0, len(_DATAS), workers + 1).astype(int).tolist()
    parts = list(itertools.pairwise(bounds))
    with mp.get_context("fork").Pool(workers) as pool:
        pool.map(_decode_part, [(a, min(b, a + 8)) for a, b in parts])  # warm-up
        t = time.perf_counter()
        n = sum(pool.map(_decode_part, parts, chunksize=1))
        return n / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--loads", type=int, nargs="+", default=[1, 12])
    ap.add_argument("--cache", type=Path, default=Path(".gpufeed-cache/bench"))
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
    lines = [
        f"# loader throughput ({time.strftime('%Y-%m-%d')})",
        "",
        f"Hardware: {cores} CPU cores ({platform.processor() or platform.machine()}), no GPU; "
        f"torch {torch.__version__}. Data: {args.images} synthetic photo-like JPEGs "
        f"(mean {np.mean(sizes) / 1e3:.0f} KB, short side 300-500 px). Output: {BATCH}×3×224×224 "
        f"float32, normalized; num_workers = {cores} for every loader.",
        "",
    ]
    limit_asis = decode_limit(asis, cores)
    limit_small = decode_limit(small, cores)
    lines += [
        f"Decode-only limit (libjpeg-turbo, full-size decode, {cores} cores): "
        f"as-is {limit_asis:.0f} img/s, resized-256 {limit_small:.0f} img/s.",
        "",
        "| load L | baseline img/s | gpufeed as-is img/s | × baseline | % of decode limit "
        "| gpufeed --resize 256 img/s | × baseline | % of decode limit | gpufeed as-is, fused "
        "load img/s | × baseline |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for load in args.loads:
        b = baseline(root, load, cores)
        g = gpufeed(asis, load, cores)
        r = gpufeed(small, load, cores)
        f = gpufeed(asis, load, cores, fused=True)
        row = (
            f"| {load} | {b:.0f} | {g:.0f} | {g / b:.2f}× | {100 * g / limit_asis:.0f}% "
            f"| {r:.0f} | {r / b:.2f}× | {100 * r / limit_small:.0f}% | {f:.0f} | {f / b:.2f}× |"
        )
        print(row, flush=True)
        lines.append(row)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
