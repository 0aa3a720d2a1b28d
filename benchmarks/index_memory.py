"""Index memory and load time at ImageNet scale: gpufeed-index.json (numpy columns) vs the old
index.json (per-shard JSON lists), the baseline.

Builds a synthetic index of 1,281,167 samples, 1,000 classes in 1,024 shards (ImageNet-style keys
such as `n01440764_10026`, realistic offsets), writes it in both formats, then loads each in a
fresh process and reports: file size, load time (median of --repeats), RSS growth of the loading
process, and the unique memory (USS) of a forked worker after it read every sample's offsets,
sizes and labels (and one key per shard).
Run: python benchmarks/index_memory.py [--samples 1281167] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from gpufeed.data.shards import INDEX_NAME, LEGACY_INDEX_NAME, Index, ShardEntry

MEASURE = r"""
import json, os, sys, time
import psutil
from gpufeed.data.shards import Index

path = sys.argv[1]
proc = psutil.Process()
import numpy, gpufeed.data.shards  # imported before the baseline: not the index's cost
before = proc.memory_info().rss
t0 = time.perf_counter()
index = Index.from_bytes(open(path, "rb").read(), path)
seconds = time.perf_counter() - t0
after = proc.memory_info().rss
r, w = os.pipe()
pid = os.fork()
if pid == 0:  # a forked worker reads every sample's offsets, sizes, labels and last key
    os.close(r)
    import numpy as np
    for s in index.shards:
        for col in (s.offsets, s.image_offsets, s.image_sizes, s.labels):
            np.asarray(col, dtype=np.int64).sum()
        s.keys[-1]
    uss = psutil.Process().memory_full_info().uss
    os.write(w, json.dumps({"uss": uss}).encode())
    os._exit(0)
os.close(w)
child = json.loads(os.read(r, 1 << 16))
os.waitpid(pid, 0)
print(json.dumps({"seconds": seconds, "rss_delta": after - before, "total": index.total,
                  "child_uss": child["uss"]}))
"""


def synthetic_index(samples: int, classes: int = 1000, shards: int = 1024) -> Index:
    """An ImageNet-like index: WNID-style keys, ~110 KB JPEGs, a .cls member after each image."""
    rng = np.random.default_rng(0)
    wnids = [f"n{1440764 + 9973 * c:08d}" for c in range(classes)]
    labels = rng.integers(0, classes, samples)
    sizes = rng.integers(20_000, 250_000, samples)
    per = np.array_split(np.arange(samples), shards)
    entries = []
    for s, ids in enumerate(per):
        keys = [f"{wnids[labels[i]]}_{i}" for i in ids]
        member = 512 + (sizes[ids] + 511) // 512 * 512 + 1024  # image header+data, .cls member
        offsets = np.concatenate([[0], np.cumsum(member)[:-1]])
        entries.append(
            ShardEntry(
                name=f"train-{s:06d}.tar",
                bytes=int(offsets[-1] + member[-1] + 1024),
                sha256="0" * 64,
                keys=keys,
                labels=labels[ids].tolist(),
                offsets=offsets.tolist(),
                image_offsets=(offsets + 512).tolist(),
                image_sizes=sizes[ids].tolist(),
                image_exts=["jpg"] * len(ids),
            )
        )
    return Index(wnids, entries)


def measure(path: Path, repeats: int) -> dict:
    runs = []
    for _ in range(repeats):
        out = subprocess.run(
            [sys.executable, "-c", MEASURE, str(path)], capture_output=True, text=True, check=True
        )
        runs.append(json.loads(out.stdout))
    return {
        "seconds": statistics.median(r["seconds"] for r in runs),
        "rss_mb": statistics.median(r["rss_delta"] for r in runs) / 2**20,
        "child_uss_mb": statistics.median(r["child_uss"] for r in runs) / 2**20,
        "file_mb": path.stat().st_size / 2**20,
        "total": runs[0]["total"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=1_281_167)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    index = synthetic_index(args.samples)
    with tempfile.TemporaryDirectory() as tmp:
        new, old = Path(tmp) / INDEX_NAME, Path(tmp) / LEGACY_INDEX_NAME
        new.write_bytes(index.to_bytes())
        old.write_bytes(index.to_bytes(version=1))
        del index
        base = measure(old, args.repeats)
        ours = measure(new, args.repeats)
    print(f"{args.samples} samples, 1000 classes, 1024 shards; {platform.machine()}, "
          f"{os.cpu_count()} cores; median of {args.repeats} fresh processes")  # fmt: skip
    print("| index | file MB | load s | RSS growth MB | forked worker USS MB |")
    print("|---|---|---|---|---|")
    for name, r in (("index.json (v1 lists, baseline)", base), ("gpufeed-index.json (v2)", ours)):
        print(
            f"| {name} | {r['file_mb']:.1f} | {r['seconds']:.2f} | {r['rss_mb']:.1f} "
            f"| {r['child_uss_mb']:.1f} |"
        )
    print(
        f"ratio vs baseline: load time {base['seconds'] / ours['seconds']:.1f}x faster, "
        f"memory {base['rss_mb'] / max(ours['rss_mb'], 0.1):.1f}x smaller"
    )


if __name__ == "__main__":
    main()
