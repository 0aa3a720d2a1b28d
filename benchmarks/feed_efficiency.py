"""Feed efficiency: does the loader keep a (simulated) GPU busy across short epochs?

CPU only, no GPU needed. A "GPU step" is stood in for by a consumer that sleeps a fixed time per
batch (`time.sleep` releases the GIL, as a training step waiting on CUDA does). For each pipeline
and data variant, three measurements, in this order, each over several short epochs:
1. loader alone: the consumer does nothing; images/s from the first batch of the first epoch on
   (worker start-up excluded, every epoch boundary included);
2. consumer alone: a loop of sleeps of t = batch / (0.75 × loader-alone rate), i.e. a consumer
   that on its own runs at 75% of the loader's rate (measured, not assumed);
3. together: a fresh loader, same settings, feeding that consumer over the same epochs.
Efficiency = together ÷ min(loader alone, consumer alone): 1.0 means the consumer never waited
for data, epoch boundaries included.

Pipelines: the gpufeed `Loader` and, as the baseline, the classic torch DataLoader over
`gpufeed.advise.naive.NaiveImageFolder` (per-image Pillow, persistent_workers=True,
drop_last=True), each with its own loader-alone rate and a consumer at 75% of it. Data variants:
shards packed as-is (full-size JPEGs) and pre-resized (`pack(..., resize=256)`); the baseline
reads the same JPEG bytes from an image folder (the resized variant is written out of the
resized shards). Repeats are interleaved; medians are reported.

Run: python benchmarks/feed_efficiency.py [--epochs 6] [--batches 6] [--batch-size 64]
     [--workers N] [--repeats 3] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.utils.data

from gpufeed.advise.naive import NaiveImageFolder
from gpufeed.atomic import write_atomic
from gpufeed.data.augment import Augment
from gpufeed.data.dataset import ShardDataset
from gpufeed.data.loader import Loader
from gpufeed.data.packing import pack
from gpufeed.demo.synth import make_image_folder

SIZE = 224
CONSUMER_FRACTION = 0.75  # the consumer alone runs at this fraction of the loader-alone rate
PIPELINES = ("gpufeed Loader", "torch DataLoader (Pillow)")
DATAS = ("as-is", "resize 256")


@dataclass
class Run:
    """One pass over `epochs` epochs by one consumer."""

    images_per_s: float
    seconds: float  # timed window: from the first batch of the first epoch in hand to the end
    startup_wait: float  # wait for the very first batch (worker start-up): outside the window
    first_batch_waits: list[float]  # per epoch, epoch 1 (start-up) included
    data_wait: float  # seconds the consumer waited for data inside the window
    late: float  # seconds the consumer's sleeps overran what was asked, summed
    freeing: float  # seconds spent dropping the batches (`del`), inside the window
    steps: int  # consumer steps (batches slept on) inside the window
    loader_stats: dict[str, Any] = field(default_factory=dict)

    @property
    def boundary_waits(self) -> list[float]:
        """First-batch waits of epochs 2.. (the epoch boundaries)."""
        return self.first_batch_waits[1:]


@dataclass
class Measure:
    """One repeat of one pipeline on one data variant."""

    alone: Run
    step_s: float
    consumer: float  # images/s of the consumer alone
    consumer_late: float  # its mean sleep overrun per step, s
    together: Run

    @property
    def other(self) -> float:
        """Seconds of the together window not slept, overrun, waited for data or spent
        freeing batches (the rest of the loop: Python overhead, waiting for the GIL)."""
        t = self.together
        return t.seconds - t.steps * self.step_s - t.late - t.data_wait - t.freeing

    @property
    def efficiency(self) -> float:
        return self.together.images_per_s / min(self.alone.images_per_s, self.consumer)


def drive(new_epoch: Callable[[], Iterator[Any]], epochs: int, batches: int, step_s: float) -> Run:
    """Iterate `epochs` epochs (each `new_epoch()` call is the next one); after each batch the
    consumer sleeps `step_s`. The clock starts when the first batch is in hand. Counted: the
    images whose consumer step ended inside the window (with step_s = 0: every batch after the
    first, the window ending when the last one arrives)."""
    t0: float | None = None
    startup, data_wait, late, freeing, images, steps = 0.0, 0.0, 0.0, 0.0, 0, 0
    waits: list[float] = []
    for epoch in range(epochs):
        ta = time.perf_counter()
        it = new_epoch()
        got = 0
        while True:
            try:
                x, y = next(it)
            except StopIteration:
                data_wait += time.perf_counter() - ta
                break
            tb = time.perf_counter()
            wait = tb - ta
            if got == 0:
                waits.append(wait)
            if t0 is None:
                t0, startup = tb, wait
                assert tuple(x.shape[1:]) == (3, SIZE, SIZE) and x.dtype == torch.float32, (
                    x.shape,
                    x.dtype,
                )
                if step_s > 0:
                    images += len(y)
            else:
                data_wait += wait
                images += len(y)
            got += 1
            tf = time.perf_counter()
            del x, y  # as a training step drops its batch: freeing it is part of the loop
            ts = time.perf_counter()
            freeing += ts - tf
            if step_s > 0:
                time.sleep(step_s)
                ta = time.perf_counter()
                late += ta - ts - step_s
                steps += 1
            else:
                ta = time.perf_counter()
        if got != batches:
            raise RuntimeError(f"epoch {epoch + 1} delivered {got} batches, expected {batches}")
    assert t0 is not None
    seconds = time.perf_counter() - t0
    return Run(images / seconds, seconds, startup, waits, data_wait, late, freeing, steps)


def consumer_alone(steps: int, step_s: float, batch: int) -> tuple[float, float]:
    """(images/s, mean sleep overrun in s) of the consumer with data for free: `steps` sleeps
    of `step_s`."""
    late = 0.0
    t = ta = time.perf_counter()
    for _ in range(steps):
        time.sleep(step_s)
        tb = time.perf_counter()
        late += tb - ta - step_s
        ta = tb
    return steps * batch / (ta - t), late / steps


def run_gpufeed(shards: Path, args: argparse.Namespace, step_s: float) -> Run:
    loader = Loader(
        shards,
        args.batch_size,
        num_workers=args.workers,
        augment=Augment.load_factor(args.load, size=(SIZE, SIZE)),
        drop_last=True,
        device="cpu",
    )
    try:
        run = drive(lambda: iter(loader), args.epochs, args.batches, step_s)
        run.loader_stats = loader.stats()
    finally:
        loader.close()
    return run


def run_baseline(folder: Path, args: argparse.Namespace, step_s: float) -> Run:
    held = [
        torch.utils.data.DataLoader(
            NaiveImageFolder(folder, Augment.load_factor(args.load, size=(SIZE, SIZE))),  # type: ignore[arg-type]
            batch_size=args.batch_size,
            shuffle=True,
            num_workers=args.workers,
            persistent_workers=args.workers > 0,
            drop_last=True,
        )
    ]
    try:
        return drive(lambda: iter(held[0]), args.epochs, args.batches, step_s)
    finally:
        held.clear()  # the last reference: its persistent workers shut down
        gc.collect()


def resized_folder(shards: Path, out: Path) -> Path:
    """The JPEGs stored in `shards` as an image folder `out/<label>/<key>.jpg` (once)."""
    done = out / ".complete"
    if done.exists():
        return out
    for s in ShardDataset(shards, shuffle=False).iter_worker(0, 1):
        path = out / f"{s.label:04d}" / (s.key.replace("/", "_") + ".jpg")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(s.data)
    done.touch()
    return out


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def ms(seconds: float) -> str:
    return f"{1e3 * seconds:.0f}"


def main() -> None:
    cores = len(os.sched_getaffinity(0))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--batches", type=int, default=None, help="batches per epoch (default 6)")
    ap.add_argument(
        "--images", type=int, default=None, help="data set size (default batches × batch size)"
    )
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=cores, help=f"num_workers (default {cores})")
    ap.add_argument("--load", type=int, default=1, help="augmentation load factor L")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--consumer-steps",
        type=int,
        default=None,
        help="sleeps in the consumer-alone measurement (default: one epoch's batches)",
    )
    ap.add_argument("--cache", type=Path, default=Path(".gpufeed-cache/bench"))
    ap.add_argument("--out", type=Path, default=None, help="write the markdown table here")
    args = ap.parse_args()
    if args.batches is None:
        args.batches = 6 if args.images is None else args.images // args.batch_size
    if args.images is None:
        args.images = args.batches * args.batch_size
    if args.images // args.batch_size != args.batches or args.batches < 1:
        ap.error(
            f"--images {args.images} with --batch-size {args.batch_size} makes "
            f"{args.images // args.batch_size} whole batches per epoch, not --batches {args.batches}"
        )
    if args.consumer_steps is None:
        args.consumer_steps = args.batches
    if args.epochs < 2:
        ap.error("--epochs must be >= 2 (epoch boundaries are what is measured)")
    torch.set_num_threads(1)  # the training process's own thread count is not the loader's

    root = make_image_folder(args.cache / f"images-{args.images}", args.images, 10)
    shards = {"as-is": args.cache / f"shards-{args.images}"}
    shards["resize 256"] = args.cache / f"shards-{args.images}-r256"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pack(root, shards["as-is"], progress=False)
        pack(root, shards["resize 256"], resize=256, quality=90, progress=False)
    folders = {
        "as-is": root,
        "resize 256": resized_folder(
            shards["resize 256"], args.cache / f"images-{args.images}-r256"
        ),
    }

    runners: dict[str, Callable[[str, float], Run]] = {
        PIPELINES[0]: lambda data, step: run_gpufeed(shards[data], args, step),
        PIPELINES[1]: lambda data, step: run_baseline(folders[data], args, step),
    }
    load_before = os.getloadavg()
    started = time.perf_counter()
    results: dict[tuple[str, str], list[Measure]] = {}
    print(
        f"{cores} cores, {args.workers} workers, {args.epochs} epochs × {args.batches} batches of "
        f"{args.batch_size} ({args.images} images), {args.repeats} repeats; "
        f"load average {load_before[0]:.2f}"
    )
    for rep in range(args.repeats):  # interleaved, so background load hits every pipeline alike
        for data in DATAS:
            for name in PIPELINES:
                alone = runners[name](data, 0.0)
                step_s = args.batch_size / (CONSUMER_FRACTION * alone.images_per_s)
                consumer, late = consumer_alone(args.consumer_steps, step_s, args.batch_size)
                together = runners[name](data, step_s)
                m = Measure(alone, step_s, consumer, late, together)
                results.setdefault((name, data), []).append(m)
                print(
                    f"repeat {rep + 1}, {name}, {data}: alone {alone.images_per_s:.0f} img/s, "
                    f"consumer {consumer:.0f} img/s (step {ms(step_s)} ms), together "
                    f"{together.images_per_s:.0f} img/s, efficiency {m.efficiency:.3f}\n"
                    f"    together: first-batch waits per epoch (ms) "
                    f"{' '.join(ms(w) for w in together.first_batch_waits)}; data wait "
                    f"{ms(together.data_wait)} ms of {together.seconds:.2f} s; sleep overrun per "
                    f"step {1e3 * together.late / together.steps:.2f} ms "
                    f"(consumer alone {1e3 * late:.2f} ms); freeing the batch "
                    f"{1e3 * together.freeing / together.steps:.2f} ms per step; rest of the "
                    f"loop {1e3 * m.other / together.steps:.2f} ms per step"
                )
                if together.loader_stats:
                    st = together.loader_stats
                    print(
                        "    together, Loader.stats(): first_batch_waits (ms) "
                        f"{' '.join(ms(w) for w in st['first_batch_waits'])}, wait_seconds "
                        f"{st['wait_seconds']:.3f}, images {st['images']}, batches {st['batches']}"
                    )
    load_after = os.getloadavg()
    elapsed = time.perf_counter() - started

    med = statistics.median
    lines = [
        f"# feed efficiency ({time.strftime('%Y-%m-%d %H:%M')})",
        "",
        f"Hardware: {cores} usable CPU cores ({cpu_model()}, {platform.machine()}), no GPU; "
        f"torch {torch.__version__}; Python {platform.python_version()}. "
        f"Load average (1 min) before/after: {load_before[0]:.2f} / {load_after[0]:.2f} "
        f"(measurements took {elapsed:.0f} s).",
        "",
        f"Settings: {args.epochs} epochs × {args.batches} batches of {args.batch_size} images "
        f"({args.images} synthetic photo-like JPEGs), {SIZE}×{SIZE} float32 out, augmentation "
        f"load L={args.load}, num_workers={args.workers}, drop_last=True; consumer step = "
        f"batch ÷ ({CONSUMER_FRACTION:.2f} × the pipeline's own loader-alone rate of the same "
        f"repeat), a `time.sleep` (releases the GIL); consumer alone measured over "
        f"{args.consumer_steps} steps. Medians of {args.repeats} interleaved repeats.",
        "",
        "Efficiency = together ÷ min(loader alone, consumer alone), per repeat; the column "
        "gives the median (min–max). Rates are timed from the first batch of the first epoch "
        "in hand (worker start-up excluded), epoch boundaries included. First-batch wait = "
        "time the consumer spent in `iter()` + the first `next()` of an epoch in the together "
        "run, at the epoch boundaries (epochs 2..N): median over repeats of the mean / the "
        "largest of all repeats; start-up = the same for epoch 1 (outside the timed window). "
        "Data-wait share = time spent waiting for batches ÷ the timed window. Sleep overrun = "
        "how much later than asked the consumer's `time.sleep` returned (a busy CPU wakes the "
        "consumer late); freeing = dropping the batch (`del images, labels`); rest = what is "
        "left of the loop (Python, the GIL). These three cost efficiency without any data "
        "wait; all per step, medians over repeats, together run.",
        "",
        "| pipeline | data | loader alone img/s | consumer alone img/s | together img/s "
        "| efficiency | first-batch wait, epochs 2.., mean / max (ms) | start-up wait (ms) "
        "| data-wait share | per step: sleep overrun / freeing / rest (ms) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for data in DATAS:
        for name in PIPELINES:
            runs = results[name, data]
            effs = [m.efficiency for m in runs]
            together = [m.together for m in runs]
            lines.append(
                f"| {name} | {data} | {med(m.alone.images_per_s for m in runs):.0f} "
                f"| {med(m.consumer for m in runs):.0f} "
                f"| {med(t.images_per_s for t in together):.0f} "
                f"| {med(effs):.3f} ({min(effs):.3f}–{max(effs):.3f}) "
                f"| {1e3 * med(statistics.fmean(t.boundary_waits) for t in together):.0f} / "
                f"{1e3 * max(w for t in together for w in t.boundary_waits):.0f} "
                f"| {1e3 * med(t.startup_wait for t in together):.0f} "
                f"| {100 * med(t.data_wait / t.seconds for t in together):.1f}% "
                f"| {1e3 * med(t.late / t.steps for t in together):.2f} / "
                f"{1e3 * med(t.freeing / t.steps for t in together):.2f} / "
                f"{1e3 * med(m.other / m.together.steps for m in runs):.2f} |"
            )
    text = "\n".join(lines) + "\n"
    print()
    print(text)
    if args.out:
        write_atomic(args.out, text, make_parents=True)


if __name__ == "__main__":
    main()
