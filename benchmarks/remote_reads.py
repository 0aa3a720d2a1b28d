"""Bytes asked of an S3 endpoint per epoch, against the baseline of the data set's own size.

Packs synthetic photo-like JPEGs to a moto S3 server on 127.0.0.1, then reads epochs the way the
loader's workers do: W streams of `BatchPlan.worker_batches`, each in its own thread (so they
run side by side, as worker processes do), counting the bytes of every ranged GET they ask for.
Shuffled and unshuffled, W = 1, 3, 8, without and with `cache_dir` (two epochs: the second
shows what the first left cached). 1.00x = each byte of the data set asked for once.
Run: python benchmarks/remote_reads.py [--images 512] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import platform
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from gpufeed.data.dataset import ShardDataset
from gpufeed.data.packing import pack
from gpufeed.data.plan import BatchPlan, Position
from gpufeed.data.source import Source, filesystem
from gpufeed.demo.synth import make_image_folder

URL = "s3://bucket/remote-reads"
BATCH = 32
CHUNK = 1 << 20  # 1 MB chunks of 8 MB shards: the default 8 MB of 64 MB shards, scaled down


class Counter:
    """Counts the bytes `Source.fetch_range` asks for, in every thread."""

    def __init__(self) -> None:
        self.bytes, self.lock, self.real = 0, threading.Lock(), Source.fetch_range
        counter = self

        def fetch_range(source: Source, entry: Any, start: int, end: int, *rest: Any) -> bytes:
            with counter.lock:
                counter.bytes += end - start
            return counter.real(source, entry, start, end, *rest)

        Source.fetch_range = fetch_range  # type: ignore[method-assign]


def epoch_bytes(ds: ShardDataset, workers: int, epoch: int, counter: Counter) -> tuple[int, int]:
    """(samples delivered, bytes asked for) of one epoch read by `workers` parallel streams."""
    plan = BatchPlan(ds, BATCH, workers, drop_last=False)
    got = [0] * workers
    counter.bytes = 0

    def run(w: int) -> None:
        own = copy.copy(ds)  # each stream its own epoch state, as each worker has
        stream = BatchPlan(own, BATCH, workers, drop_last=False).worker_batches(
            w, Position(epoch, 0)
        )
        for _ in range(len(range(w, plan.batches, workers))):
            got[w] += len(next(stream)[1])
        stream.close()

    threads = [threading.Thread(target=run, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    time.sleep(0.5)  # read-ahead still in flight is counted too
    return sum(got), counter.bytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's per-request lines
    os.environ.update(AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="x")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ["AWS_ENDPOINT_URL"] = f"http://{host}:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        images = make_image_folder(
            Path(tmp) / "images", args.images, 4, short_side=(300, 400), quality=(85, 90)
        )
        filesystem(URL).mkdir("bucket")
        pack(images, URL, shard_size="8MB", workers=2, progress=False)
        counter = Counter()
        rows = []
        for cache in (False, True):
            for shuffle in (False, True):
                for workers in (1, 3, 8):
                    ds = ShardDataset(
                        URL,
                        shuffle=shuffle,
                        chunk_size=CHUNK,
                        cache_dir=tempfile.mkdtemp(dir=tmp) if cache else None,
                    )
                    total = sum(e.bytes for e in ds.index.shards)
                    asked = []
                    for epoch in (0, 1) if cache else (0,):
                        n, b = epoch_bytes(ds, workers, epoch, counter)
                        assert n == len(ds), f"{n} samples delivered of {len(ds)}"
                        asked.append(b / total)
                    rows.append((cache, shuffle, workers, total, asked))
                    print(
                        f"cache_dir={cache} shuffle={shuffle} W={workers}: "
                        + ", ".join(f"epoch {e + 1} {a:.2f}x" for e, a in enumerate(asked))
                        + f" of {total / 1e6:.1f} MB",
                        flush=True,
                    )
    server.stop()
    lines = [
        "# remote reads",
        "",
        f"{args.images} JPEGs in 8 MB shards on moto S3 (loopback), {CHUNK >> 20} MB chunks, "
        f"read-ahead 2, batches of {BATCH}; {platform.machine()}, Python "
        f"{platform.python_version()}. Bytes asked for ÷ the data set's bytes "
        "(1.00x = each byte once).",
        "",
        "| cache_dir | shuffle | workers | epoch 1 | epoch 2 |",
        "|---|---|---|---|---|",
    ]
    for cache, shuffle, workers, _, asked in rows:
        second = f"{asked[1]:.2f}x" if len(asked) > 1 else ""
        lines.append(f"| {cache} | {shuffle} | {workers} | {asked[0]:.2f}x | {second} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
