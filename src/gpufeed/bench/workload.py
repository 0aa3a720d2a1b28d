"""What the experiments share: their settings, the data they train on, and one measured training run.

The data is the embedded photo-like image set (`synth.make_image_folder`) or the user's own image
folder, packed once into shards under a cache directory and reused by later runs.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from gpufeed.atomic import write_atomic
from gpufeed.cores import usable_cores
from gpufeed.data.index_file import has_index
from gpufeed.errors import GpufeedError

T = TypeVar("T")
DEFAULT_CACHE = Path(".gpufeed-cache/bench")


class BenchError(GpufeedError, ValueError):
    """Bad input to an experiment; the message names the option and what to do."""


def _load_average() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0


@dataclass
class BenchConfig:
    """Sizes and settings every experiment uses. ``full`` is the GPU-scale grid; otherwise the
    reduced one (small images, resnet18, few steps) that finishes in minutes on a CPU."""

    full: bool
    images: int
    short_side: tuple[int, int]
    image_size: int
    batch_size: int
    steps: int | None  # per configuration; None = one pass over the data set
    warmup: int
    amp: str | None
    channels_last: bool
    workers: int
    classes: int = 10
    repeats: int = 1  # augload: interleaved repeats of the whole grid, reported as medians
    device: str = "cpu"
    threads: int | None = None  # torch threads of the training process on a CPU device
    data: Path | None = None
    cache: Path = DEFAULT_CACHE
    budget_s: float | None = None
    progress: bool = True
    started: float = field(default_factory=time.monotonic, repr=False)
    # read before the data is generated and packed, which loads the machine itself
    load_at_start: float = field(default_factory=_load_average, repr=False)

    def params(self) -> dict[str, Any]:
        """The settings as recorded with the results."""
        out = asdict(self)
        for name in ("started", "progress", "load_at_start"):
            out.pop(name)
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in out.items()}

    def steps_for(self, batch_size: int) -> int:
        """Steps per configuration: the cap, or one pass over the data set (at least 10 measured)."""
        return self.steps or max(self.warmup + 10, self.images // batch_size)


def default_config(full: bool | None = None, **overrides: Any) -> BenchConfig:
    """The full grid where CUDA exists (or when ``full=True``), the reduced one otherwise; then
    ``overrides`` (options left as None keep the default)."""
    import torch

    cuda = torch.cuda.is_available()
    full = cuda if full is None else full
    workers = max(1, usable_cores() - 1)
    if full:
        cfg = BenchConfig(True, 2048, (300, 500), 224, 32, None, 5, "bf16", True, workers)
    else:
        cfg = BenchConfig(False, 320, (96, 160), 64, 16, 16, 3, None, False, workers, repeats=3)
    cfg.device = "cuda" if cuda else "cpu"
    if not cuda:
        cfg.amp, cfg.channels_last = (
            None,
            False,
        )  # bf16 autocast on CPUs without AMX only slows down
    cfg = replace(cfg, **{k: v for k, v in overrides.items() if v is not None})
    if cfg.device == "cpu" and cfg.threads is None:
        # Leave the loader workers their cores: OpenMP threads competing for a busy core spin and
        # slow every op down by an order of magnitude, which would measure the scheduler.
        cfg.threads = max(1, usable_cores() - cfg.workers)
    for name in ("images", "image_size", "batch_size", "workers", "classes", "repeats"):
        if getattr(cfg, name) < 1:
            raise BenchError(
                f"--{name.replace('_', '-')} must be at least 1, got {getattr(cfg, name)}"
            )
    if cfg.steps is not None and cfg.steps < 1:
        raise BenchError(f"--steps must be at least 1, got {cfg.steps}")
    if cfg.budget_s is not None and cfg.budget_s <= 0:
        raise BenchError(f"--budget must be a positive number of seconds, got {cfg.budget_s}")
    cfg.cache = Path(cfg.cache)
    if cfg.data is not None:
        cfg.data = Path(cfg.data)
        if not cfg.data.is_dir():
            raise BenchError(
                f"--data {cfg.data}: no such directory (want an image folder or shards)"
            )
    return cfg


# --- data -----------------------------------------------------------------------------------------


def _is_shards(path: Path) -> bool:
    return has_index(path)


def image_folder(cfg: BenchConfig) -> Path:
    """The image folder to pack: ``--data`` or the embedded synthetic set (generated once)."""
    if cfg.data is not None:
        if _is_shards(cfg.data):
            raise BenchError(
                f"--data {cfg.data} holds shards; this experiment packs images itself "
                "(resized and not): pass the image folder they came from"
            )
        return cfg.data
    from gpufeed.demo.synth import make_image_folder

    lo, hi = cfg.short_side
    root = cfg.cache / f"images-{cfg.images}-{cfg.classes}c-{lo}-{hi}"
    return make_image_folder(root, cfg.images, cfg.classes, short_side=(lo, hi))


@dataclass(frozen=True)
class Shards:
    """A shard set an experiment trains on: where it is, how many images it holds, and the input
    files its pack skipped (path, why), which the results must mention."""

    path: Path
    images: int
    skipped: tuple[tuple[str, str], ...] = ()


def shards(cfg: BenchConfig, resize: int | None = None) -> Shards:
    """Shards of the experiment's images, resized at pack time to short side ``resize`` if given;
    generated and packed under ``cfg.cache`` (BenchError naming --cache where it cannot be
    written)."""
    if cfg.data is not None and resize is None and _is_shards(cfg.data):
        return Shards(cfg.data, n_samples(cfg.data))
    from gpufeed.data.packing import pack_cache

    try:
        cfg.cache.mkdir(parents=True, exist_ok=True)
        folder = image_folder(cfg)
        tag = hashlib.sha1(str(folder.resolve()).encode()).hexdigest()[:8]
        dst = cfg.cache / f"shards-{folder.name}-{tag}-{f'r{resize}' if resize else 'orig'}"
        result = pack_cache(folder, dst, resize=resize, progress=False)
        # a pack found already done does not say what it skipped: keep that next to it
        record = dst.with_name(dst.name + "-skipped.json")
        if result.already_packed:
            skipped = _read_skipped(record)
        else:
            skipped = [tuple(s) for s in result.skipped]
            write_atomic(record, json.dumps(skipped) + "\n")
    except OSError as e:
        raise BenchError(
            f"--cache {cfg.cache}: cannot write there ({e.strerror or e}); "
            "give a folder you can write to"
        ) from None
    return Shards(dst, result.samples, tuple(skipped))


def _read_skipped(record: Path) -> list[tuple[str, str]]:
    """The (path, why) list an earlier pack wrote to ``record``; empty if none was kept."""
    try:
        return [(str(path), str(why)) for path, why in json.loads(record.read_text())]
    except (OSError, ValueError, TypeError):
        return []


def n_samples(path: Path) -> int:
    """Images in a shard set (from its index)."""
    from gpufeed.data.dataset import ShardDataset

    return len(ShardDataset(str(path), shuffle=False))


# --- one measured run -----------------------------------------------------------------------------


@dataclass
class Measured:
    """One training run's figures."""

    images_per_s: float
    steps: int
    data_wait: float
    cpu_util: float
    wall_s: float
    loader: dict[str, Any] = field(default_factory=dict)


def make_loader(
    cfg: BenchConfig,
    data: Path,
    *,
    preprocess: str = "cpu",
    load: int = 1,
    workers: int | None = None,
    batch_size: int | None = None,
) -> Any:
    """A gpufeed Loader over ``data`` with the experiment's image size, device and layout."""
    from gpufeed.data.augment import Augment
    from gpufeed.data.loader import Loader

    return Loader(
        str(data),
        batch_size or cfg.batch_size,
        num_workers=cfg.workers if workers is None else workers,
        preprocess=preprocess,
        device=cfg.device,
        augment=Augment.load_factor(load, size=(cfg.image_size, cfg.image_size)),
        channels_last=cfg.channels_last,
        seed=0,
    )


def train(cfg: BenchConfig, model_name: str, data: Any, steps: int, batch_size: int) -> Measured:
    """Train a fresh ``model_name`` for ``steps`` on ``data`` (a Loader or SyntheticData)."""
    import psutil
    import torch

    from gpufeed.train.loop import SyntheticData, fit
    from gpufeed.train.resnet import resnet

    torch.manual_seed(0)
    threads = torch.get_num_threads()
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    model = resnet(model_name, num_classes=cfg.classes)
    epochs = 1
    if not isinstance(data, SyntheticData):  # a short data set is repeated until `steps`
        epochs = max(1, math.ceil(steps * batch_size / max(1, len(data.dataset))) + 1)
    psutil.cpu_percent(None)
    t0 = time.perf_counter()
    try:
        result = fit(
            model,
            data,
            epochs=epochs,
            steps=steps,
            warmup=min(cfg.warmup, max(0, steps - 2)),
            amp=cfg.amp,
            channels_last=cfg.channels_last,
            device=cfg.device,
            verbose=False,
        )
    finally:
        torch.set_num_threads(threads)
    wall = time.perf_counter() - t0
    cpu = psutil.cpu_percent(None)
    stats = data.stats() if hasattr(data, "stats") else {}
    return Measured(result.images_per_s, result.steps, result.data_wait_fraction, cpu, wall, stats)


def synthetic(cfg: BenchConfig, batch_size: int | None = None) -> Any:
    """The model-only ceiling's data: one resident batch of the experiment's shape."""
    from gpufeed.train.loop import SyntheticData

    b = batch_size or cfg.batch_size
    return SyntheticData(b, cfg.image_size, cfg.classes, steps=cfg.steps_for(b))


# --- running a grid -------------------------------------------------------------------------------


def over_budget(cfg: BenchConfig) -> bool:
    """True once the experiment has used its time budget."""
    return cfg.budget_s is not None and time.monotonic() - cfg.started > cfg.budget_s


def progress(cfg: BenchConfig, items: Sequence[T], label: Any, title: str) -> Iterator[T]:
    """Yield ``items`` under a rich progress bar (``label(item)`` names the one running) until the
    time budget runs out; the caller checks `over_budget` to learn why it stopped."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = (
        Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            transient=False,
        )
        if cfg.progress
        else nullcontext()
    )
    with bar as p:
        task = p.add_task(title, total=len(items)) if p is not None else None
        for item in items:
            if over_budget(cfg):
                return
            if p is not None:
                p.update(task, description=f"{title}: {label(item)}")
            yield item
            if p is not None:
                p.advance(task)
