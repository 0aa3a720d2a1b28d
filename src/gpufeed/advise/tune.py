"""`gpufeed tune`: find the `Loader` settings that feed a model fastest, by short measured trials.

The first trial is the Loader's defaults; then loader workers, prefetch depth, CPU vs GPU
preprocessing (GPU only where CUDA exists; with `--augment-load` above 1 also the split of
`decoder="workers"`: the CPU workers decode and crop, the GPU makes the other warps), decoding
only the crop boxes (where nvImageCodec is installed: `Loader(decoder="nvimgcodec")`) and, if
allowed, the batch size, each varied around the best so far. Every trial's loader augments as
`--augment-load` says (`measure.recipe`: the ImageNet recipe at 0, heavier rotations from 1, the
default, as `diagnose` measures): the cost per image decides how many workers, and whether GPU
preprocessing, pay. Each trial is measured `repeats` times (median kept, spread shown); one that
a limit refuses (a memory cap, say) is skipped and the reason noted. With a model, its images/s
alone is measured first and each trial trains it on the loader's batches (end to end): the
search stops as soon as training no longer waits for data (more loader speed would only idle).
The winner is written as JSON:

    from gpufeed.data import Loader, load_settings
    loader = Loader("shards/", **load_settings("gpufeed-tune.json"))

This module is the search; what it found, the JSON and the printed table are `tune_result`'s.
"""

from __future__ import annotations

import math
import os
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpufeed.advise.measure import (
    DEFAULT_AUGMENT_LOAD,
    WAITING,
    MeasureError,
    Rate,
    TrainSettings,
    build_model,
    check_batch_memory,
    check_device,
    cpu_threads_beside,
    measure_loader,
    measure_together,
    model_classes,
    recipe,
)
from gpufeed.advise.progress import progress_notes
from gpufeed.advise.tune_result import Trial, TuneResult, described
from gpufeed.atomic import write_atomic
from gpufeed.data.location import is_remote
from gpufeed.devices import default_device
from gpufeed.extras import installed
from gpufeed.text import count

DEFAULT_OUT = "gpufeed-tune.json"


def _worker_counts(most: int) -> list[int]:
    """The worker counts tried: 0, 1, doubling (with a step half-way from 8 on: 12, 24, ...)
    below `most`, and `most`."""
    counts = {0, 1, most}
    n = 2
    while n < most:
        counts.add(n)
        if n >= 8 and n * 3 // 2 < most:
            counts.add(n * 3 // 2)
        n *= 2
    return sorted(counts)


def tune(
    data: str,
    model: str | None = None,
    batch_size: int = 64,
    device: str | None = None,
    image_size: int = 224,
    allow_batch_change: bool = False,
    out: str | os.PathLike[str] | None = DEFAULT_OUT,
    seconds: float = 2.5,
    progress: bool = True,
    repeats: int = 3,
    augment_load: int = DEFAULT_AUGMENT_LOAD,
) -> TuneResult:
    """Run the trials, each loader augmenting by `recipe(image_size, augment_load)`, and write the
    winner to `out` (None: don't write); return them all. It prints nothing but, with
    `progress`, each trial as it starts (on stderr)."""
    from gpufeed.advise.inputs import pack_sample, resolve_data, sample_resize
    from gpufeed.cores import usable_cores

    note = progress_notes(progress)
    device = check_device(device or default_device())
    if batch_size < 1 or image_size < 16:
        raise MeasureError("--batch-size must be at least 1 and --image-size at least 16")
    check_batch_memory(batch_size, image_size)
    if repeats < 1:
        raise MeasureError(f"--repeats must be at least 1, got {repeats}")
    recipe(image_size, augment_load)  # a bad load fails here, before anything is measured
    if ":" in data and not Path(data).is_dir() and not is_remote(data):
        raise MeasureError(
            f"--data {data}: tune searches the gpufeed Loader's settings; give shards "
            "(`gpufeed pack`) or an image folder, not your own loader (use `gpufeed diagnose`)"
        )
    if out is not None and Path(out).is_dir():
        raise MeasureError(f"--out {out}: is a folder; give a file name, e.g. {DEFAULT_OUT}")
    if out is not None and not Path(out).parent.is_dir():
        raise MeasureError(f"--out {out}: the folder {Path(out).parent} does not exist")
    spec = resolve_data(data)
    net = build_model(model) if model else None
    if net is not None:  # a model that cannot take the images fails once, here, not per trial
        model_classes(net.to(device), image_size, image_size, device)
    with tempfile.TemporaryDirectory(prefix="gpufeed-tune-") as tmp:
        shards = spec.where
        notes = []
        if spec.kind == "folder":
            note("an image folder: packing a pre-resized sample to tune on …")
            sample = pack_sample(spec.where, Path(tmp), image_size)
            shards = str(sample.shards)
            notes.append(
                "tuned on a pre-resized sample of the image folder: its rates hold for shards "
                f"packed as `gpufeed pack {spec.where} DST --resize {sample_resize(image_size)}`"
            )
            if sample.skipped:
                notes.append(sample.left_out())
        result = TuneResult(
            data, device, image_size, [], model, notes=notes, augment_load=augment_load
        )
        _search(
            result, shards, batch_size, allow_batch_change, usable_cores(), seconds, note, net,
            repeats,
        )  # fmt: skip
        if not result.trials:
            raise MeasureError("every trial was skipped: " + "; ".join(result.notes))
        best = result.best
        if net is None and best.preprocess == "gpu" and best.decoder != "workers":
            result.notes.append(GPU_ALONE_NOTE)
        if net is not None:
            from gpufeed.advise.measure import measure_model

            # on a CPU device, with the threads the best trial's workers leave it, as it trained
            with cpu_threads_beside(best.num_workers, device) as threads:
                where = f"{device}, {count(threads, 'thread')}" if device == "cpu" else device
                note(f"measuring the model alone: {model} on {where} …")
                # the batches the data gives: a data set smaller than a batch gives it whole
                from gpufeed.data.dataset import ShardDataset

                n = min(best.batch_size, ShardDataset(shards, world_size=1, rank=0).index.total)
                shape = (n, 3, image_size, image_size)
                result.model_images_per_s = measure_model(
                    net, shape, device, seconds, settings=TrainSettings.for_device(device)
                ).images_per_s
        # --- offload to a Ray cluster's CPU nodes: would more cores help? (advise/offload.py) ---
        if result.model_images_per_s and best.preprocess == "cpu" and best.images_per_s > 0:
            from gpufeed.advise.offload import offload_advice

            # the trials' rates are end to end, held back by the model: the CPU an image costs
            # comes from the best trial's loader alone
            note(f"measuring the loader alone: {described(best)} …")
            alone = _loader_alone(shards, best, result, seconds)
            if alone is not None:
                rates = (alone.images_per_s, best.num_workers, result.model_images_per_s)
                hw = (image_size, image_size)
                cores = max(1, usable_cores() - 1)
                result.offload = offload_advice(
                    *rates, cores, hw, alone.cpu_s_per_image, best.data_wait_share
                )
    if out is not None:
        result.out = Path(out)
        try:
            write_atomic(result.out, result.to_json() + "\n")
        except OSError as e:  # the trials are not lost: the result is returned and printed
            result.out = None
            result.notes.append(f"could not write --out {out}: {e.strerror or e}")
    return result


# Without a model, trials are the loader alone: a GPU decoder's rate hides the GPU time it takes
GPU_ALONE_NOTE = (
    "the best trial decodes on the GPU, measured without a model: training shares the GPU with "
    "it and may still wait (nvJPEG beside ResNet-50 on an H200: 13,000 images/s alone, 0.86 of "
    "the model's speed in training, where the CPU workers gave 0.99); pass --model to measure "
    "the trials trained end to end"
)


def _loader(shards: str, trial: Trial, result: TuneResult) -> Any:
    """The Loader that `trial` measures (a ValueError where its settings are refused)."""
    from gpufeed.data.loader import Loader

    return Loader(
        shards,
        trial.batch_size,
        num_workers=trial.num_workers,
        prefetch=trial.prefetch,
        preprocess=trial.preprocess,
        decoder=trial.decoder,
        device=result.device,
        augment=recipe(result.image_size, result.augment_load),
    )


def _loader_alone(shards: str, trial: Trial, result: TuneResult, seconds: float) -> Rate | None:
    """`trial`'s Loader measured alone (None where it cannot be, with a note)."""
    try:
        loader = _loader(shards, trial, result)
    except ValueError as e:
        result.notes.append(f"no offload advice: {e}")
        return None
    try:
        rate = measure_loader(loader, seconds=seconds)
        return rate if rate.images_per_s > 0 else None
    except MeasureError as e:
        result.notes.append(f"no offload advice: {e}")
        return None
    finally:
        loader.close()


def _search(
    result: TuneResult,
    shards: str,
    batch_size: int,
    allow_batch_change: bool,
    cores: int,
    seconds: float,
    note: Callable[[str], None],
    net: Any = None,
    repeats: int = 3,
) -> None:
    """Coordinate search from the defaults: workers, then prefetch, preprocess, batch size."""
    from gpufeed.data.choose import choose_preprocess
    from gpufeed.data.loader import default_workers

    def run(trial: Trial) -> bool:
        """Measure a trial; True when the search should stop (the loader outruns the model)."""
        if any(t.settings() == trial.settings() for t in result.trials):
            return False
        note(f"trial {len(result.trials) + 1}: {described(trial)} …")
        try:
            loader = _loader(shards, trial, result)
        except ValueError as e:  # e.g. a memory cap this trial does not fit: skip it, say why
            result.notes.append(f"skipped {described(trial)}: {e}")
            return False
        rates, waits = [], []
        try:
            if not result.trials:  # unrecorded: the default is not measured on a cold cache
                measure_loader(loader, seconds=min(seconds, 1.0))
            for _ in range(repeats):
                if net is None:
                    rates.append(measure_loader(loader, seconds=seconds).images_per_s)
                else:
                    train = TrainSettings.for_device(result.device)
                    size = result.image_size
                    # on a CPU device the model trains on the cores this trial's workers leave
                    with cpu_threads_beside(trial.num_workers, result.device):
                        rate = measure_together(
                            net,
                            loader,
                            result.device,
                            seconds,
                            settings=train,
                            classes=model_classes(net, size, size, result.device),
                        )
                    rates.append(rate.images_per_s)
                    waits.append(rate.data_wait_share)
        except MeasureError as e:  # a limit met while running (memory cap, device): skip, say why
            result.notes.append(f"skipped {described(trial)}: {e}")
            return False
        finally:
            loader.close()  # its worker processes, before the next trial starts its own
        median = statistics.median(rates)
        result.trials.append(
            Trial(
                **trial.settings(),
                images_per_s=median,
                note=trial.note,
                # one measurement has no spread to show
                spread=(max(rates) - min(rates)) / median
                if median > 0 and len(rates) > 1
                else math.nan,
                data_wait_share=statistics.median(waits) if waits else math.nan,
            )
        )
        if net is not None and waits and statistics.median(waits) < WAITING:
            result.stopped_early = True  # training no longer waits for data: nothing to gain
            return True
        return False

    base = Trial(batch_size, default_workers(), 2, "cpu", note="default")
    if run(base):
        return
    # On CUDA the training process keeps a core of its own, so the Loader's default is the most
    # workers can use; on a CPU device the trials with a model measure the trade-off themselves.
    most = default_workers() if result.device == "cuda" else cores
    for n in sorted(set(_worker_counts(most)) | {default_workers()}):
        if run(Trial(batch_size, n, 2, "cpu")):
            return
    best = result.best if result.trials else base
    for depth in (4, 8) if best.num_workers else ():  # no workers: nothing is made ahead
        if run(Trial(batch_size, best.num_workers, depth, "cpu")):
            return
    # CPU workers or the GPU: the Loader's own choice (data/choose.py), on trials measured here
    best = result.best if result.trials else base

    def rate(mode: str) -> float:
        trial = Trial(batch_size, best.num_workers, best.prefetch, mode)
        run(trial)  # measured once: the CPU one already is
        done = [t for t in result.trials if t.settings() == trial.settings()]
        return done[0].images_per_s if done else 0.0  # a skipped trial loses

    choose_preprocess("auto", result.device, None, rate)
    if result.stopped_early:
        return
    if result.device == "cuda" and result.augment_load > 1:
        # the CPU workers decode, crop and make the first warp; the GPU the other L - 1 warps
        split = Trial(batch_size, best.num_workers, best.prefetch, "gpu", decoder="workers")
        if run(split):
            return
    best = result.best if result.trials else base
    if best.preprocess == "cpu" and installed("nvimgcodec"):  # the workers decode crop boxes only
        regions = Trial(batch_size, best.num_workers, best.prefetch, "cpu", decoder="nvimgcodec")
        if run(regions):
            return
    if allow_batch_change:
        best = result.best if result.trials else base
        for b in (batch_size // 2, batch_size * 2):
            bigger = Trial(
                b, best.num_workers, best.prefetch, best.preprocess, decoder=best.decoder
            )
            if b >= 1 and run(bigger):
                return
