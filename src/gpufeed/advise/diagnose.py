"""`gpufeed diagnose`: is a training job input-bound or compute-bound? Measured in well under a minute.

Three measurements, all with the job's settings (precision, channels_last, torch.compile, batch,
workers; on CUDA bf16 autocast and channels_last unless told otherwise): the loader alone (batches
pulled as fast as it delivers them), the model alone (one batch resident on the device: the
ceiling), and both together (the model trained on the loader's batches). Each can be fast alone
while together they stall, so the verdict comes from the together run: input-bound when its steps
wait for data `WAITING` of the time or more; the end-to-end share of the ceiling is named. For an input-bound job, the usual fixes are
measured too: more workers, pre-resized shards and GPU preprocessing where CUDA exists. GPU
preprocessing shares the GPU with the model, so it is also trained on end to end: alone it may
deliver 3× the images the model takes, and still make training wait (nvJPEG beside RN-50 on an
H200: 13,000 images/s alone, 0.86 of the ceiling in training; benchmarks/results/gpu-feed-h200).
What it found, and the report it prints, is `diagnosis_report.Diagnosis`.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufeed.advise.diagnosis_report import Alternative, Diagnosis
from gpufeed.advise.inputs import SAMPLE_IMAGES, DataSpec, pack_sample, resolve_data
from gpufeed.advise.measure import (
    DEFAULT_AUGMENT_LOAD,
    WAITING,  # noqa: F401  (read from here by benchmarks/gpu_verdicts.py)
    MeasureError,
    Rate,
    TrainSettings,
    build_model,
    check_batch_memory,
    check_device,
    cpu_threads_beside,
    measure_loader,
    measure_model,
    measure_together,
    model_classes,
    recipe,
)
from gpufeed.advise.progress import progress_notes
from gpufeed.devices import default_device
from gpufeed.text import count

if TYPE_CHECKING:
    from gpufeed.advise.offload import OffloadAdvice
    from gpufeed.data.augment import Augment


def assumed_workers(device: str = "cpu") -> int:
    """Loader workers assumed for an image folder or shards when `--workers` is not given: the
    Loader's own default on CUDA; half the usable cores on a CPU, which also trains."""
    from gpufeed.cores import usable_cores
    from gpufeed.data.loader import default_workers

    return default_workers() if device == "cuda" else max(1, usable_cores() // 2)


def most_workers(device: str) -> int:
    """The most loader workers an alternative gets: on CUDA the Loader's default (every core but
    the training process's own), on a CPU device every core (the model then trains on what the
    workers leave, as `_alternative_ceilings` times it)."""
    from gpufeed.cores import usable_cores
    from gpufeed.data.loader import default_workers

    return default_workers() if device == "cuda" else usable_cores()


def make_pipeline(
    spec: DataSpec, batch_size: int, workers: int, augment: Augment, device: str
) -> tuple[str, Iterable[Any]]:
    """(description, loader) for what `--data` names, as the user would run it."""
    if spec.kind == "function":
        assert spec.loader is not None
        nw = getattr(spec.loader, "num_workers", None)
        desc = f"your loader ({spec.where}" + (f", num_workers={nw})" if nw is not None else ")")
        return desc, spec.loader
    if spec.kind == "folder":
        from gpufeed.advise.naive import naive_loader

        try:
            loader = naive_loader(spec.where, batch_size, workers, augment)
        except ValueError as e:
            raise MeasureError(f"--data {spec.where}: {e}") from None
        return f"PyTorch DataLoader + Pillow decode, num_workers={workers}", loader
    return f"gpufeed Loader (CPU preprocessing, num_workers={workers})", _gpufeed_loader(
        spec.where, batch_size, workers, augment, device, "cpu"
    )


def _gpufeed_loader(
    shards: str,
    batch_size: int,
    workers: int,
    augment: Augment,
    device: str,
    preprocess: str,
    decoder: str = "auto",
) -> Any:
    from gpufeed.data.loader import Loader
    from gpufeed.data.shards import ShardError

    try:
        return Loader(
            shards,
            batch_size,
            num_workers=workers,
            preprocess=preprocess,
            device=device,
            augment=augment,
            decoder=decoder,
        )
    except (ShardError, ValueError) as e:
        raise MeasureError(f"--data {shards}: {e}") from None


def _more_workers(loader: Any, workers: int) -> Any | None:
    """The same torch DataLoader with more worker processes, or None if it cannot be rebuilt."""
    import torch.utils.data

    if not isinstance(loader, torch.utils.data.DataLoader) or loader.num_workers >= workers:
        return None
    if isinstance(loader.dataset, torch.utils.data.IterableDataset):
        return None  # an iterable dataset may not split itself across workers
    # a batch_sampler stands for batch_size, sampler and drop_last: pass it, or those three
    batching: dict[str, Any] = (
        {"batch_sampler": loader.batch_sampler}
        if loader.batch_size is None and loader.batch_sampler is not None
        else {
            "batch_size": loader.batch_size,
            "sampler": loader.sampler,
            "drop_last": loader.drop_last,
        }
    )
    return torch.utils.data.DataLoader(
        loader.dataset,
        **batching,
        num_workers=workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        worker_init_fn=loader.worker_init_fn,
        prefetch_factor=loader.prefetch_factor if loader.num_workers > 0 else None,
        multiprocessing_context=loader.multiprocessing_context,
        generator=loader.generator,
    )


def alternatives(
    spec: DataSpec,
    loader: Iterable[Any],
    workers: int,
    batch_size: int,
    augment: Augment,
    device: str,
    seconds: float,
    tmp: Path,
    note: Callable[[str], None] = lambda s: None,
    train: Callable[[Any], Rate] | None = None,
) -> list[Alternative]:
    """Measured alternatives for an input-bound job (only those that apply to this data). Those
    that preprocess on the GPU are also trained on with `train(loader)` where it is given: they
    take GPU time from the model, which their rate alone does not show."""
    import torch

    cores = most_workers(device)
    gpu = torch.cuda.is_available() and device == "cuda"
    # (name, its workers, whether Loader(cluster=...) runs it, how to make it)
    plans: list[tuple[str, int, bool, Callable[[], Any]]] = []

    def on_gpu(where: Callable[[], str], nw: int, label: str) -> None:
        """The GPU-preprocessing plans: the GPU decodes; with later warps (load > 1) also the
        split, where the CPU workers decode and crop and the GPU makes the other warps."""
        plans.append(
            (
                f"{label}gpufeed Loader (GPU preprocessing, num_workers={nw})",
                nw,
                False,
                lambda: _gpufeed_loader(where(), batch_size, nw, augment, device, "gpu"),
            )
        )
        if augment.load > 1:
            plans.append(
                (
                    f"{label}gpufeed Loader (CPU decode, GPU warps: decoder='workers', "
                    f"num_workers={nw})",
                    nw,
                    False,
                    lambda: _gpufeed_loader(
                        where(), batch_size, nw, augment, device, "gpu", decoder="workers"
                    ),
                )
            )

    if spec.kind == "function":
        faster = _more_workers(loader, cores)
        if faster is not None:
            plans.append((f"your loader with num_workers={cores}", cores, False, lambda: faster))
    elif spec.kind == "folder":
        from gpufeed.advise.naive import naive_loader

        if cores > workers:
            plans.append(
                (
                    f"PyTorch DataLoader + Pillow decode, num_workers={cores}",
                    cores,
                    False,
                    lambda: naive_loader(spec.where, batch_size, cores, augment),
                )
            )
        shards: list[Path] = []

        def sample() -> str:
            if not shards:
                note(f"packing a sample of up to {SAMPLE_IMAGES} images, pre-resized …")
                packed = pack_sample(spec.where, tmp, augment.size[0])
                if packed.skipped:
                    note(packed.left_out())
                shards.append(packed.shards)
            return str(shards[0])

        plans.append(
            (
                f"pre-resized shards, gpufeed Loader (CPU, num_workers={cores})",
                cores,
                True,
                lambda: _gpufeed_loader(sample(), batch_size, cores, augment, device, "cpu"),
            )
        )
        if gpu:
            on_gpu(sample, cores, "pre-resized shards, ")
    else:
        if cores > workers:
            plans.append(
                (
                    f"gpufeed Loader (CPU preprocessing, num_workers={cores})",
                    cores,
                    True,
                    lambda: _gpufeed_loader(spec.where, batch_size, cores, augment, device, "cpu"),
                )
            )
        if gpu:
            on_gpu(lambda: spec.where, workers, "")
    out = []
    for name, nw, cluster, make in plans:
        note(f"measuring alternative: {name}")
        try:
            loader = make()
            try:
                rate = measure_loader(loader, seconds=seconds)
                trained = None
                if train is not None and getattr(loader, "preprocess", "cpu") == "gpu":
                    note(f"training on it: {name}")
                    try:
                        trained = train(loader)
                    except MeasureError as e:  # its rate alone stands, judged as such
                        note(f"could not train on {name}: {e}")
            finally:
                _close(loader)
        except MeasureError as e:  # this alternative cannot run here: say why, measure the rest
            note(f"skipped {name}: {e}")
            continue
        out.append(
            Alternative(name, rate.images_per_s, nw, rate.cpu_s_per_image, cluster, trained=trained)
        )
    return out


def _alternative_ceilings(
    d: Diagnosis, net: Any, seconds: float, note: Callable[[str], None] = lambda s: None
) -> None:
    """On a CPU device, time the model alone with the threads each alternative's workers leave it
    (once per thread count): beside them it trains with those, not with the job's split."""
    timed = {d.threads: d.model_rate.images_per_s}
    for a in d.alternatives:
        with cpu_threads_beside(a.workers or 0, "cpu") as threads:
            if threads not in timed:
                note(f"measuring the model alone with {count(threads, 'thread')} …")
                shape, settings = d.loader.batch_shape, d.settings
                rate = measure_model(net, shape, "cpu", seconds=seconds, settings=settings)
                timed[threads] = rate.images_per_s
        a.threads, a.ceiling = threads, timed[threads]


def _close(loader: Any) -> None:
    """Stop a gpufeed Loader's threads and worker processes now, not when it is freed: they must not
    outlive the measurement (an alternative's shards are deleted after it, and a daemon thread
    still running torch code at interpreter exit aborts the process)."""
    close = getattr(loader, "close", None)
    if callable(close):
        close()


def diagnose(
    data: str,
    model: str = "resnet18",
    batch_size: int = 64,
    device: str | None = None,
    workers: int | None = None,
    image_size: int = 224,
    seconds: float = 4.0,
    progress: bool = True,
    precision: str | None = "auto",
    channels_last: bool | None = None,
    compile: bool = False,
    augment_load: int = DEFAULT_AUGMENT_LOAD,
) -> Diagnosis:
    """Measure loader alone, model alone and both together with the job's settings; return the
    verdict (from the together figure) and, if input-bound, measured alternatives. Images from a
    folder or shards get `recipe(image_size, augment_load)`; the user's own loader its own. It
    prints nothing but, with `progress`, what it is measuring (on stderr)."""
    note = progress_notes(progress)
    device = check_device(device or default_device())
    for name, value, least in (
        ("--batch-size", batch_size, 1),
        ("--image-size", image_size, 16),
        ("--workers", 0 if workers is None else workers, 0),
    ):
        if value < least:
            raise MeasureError(f"{name} must be at least {least}, got {value}")
    check_batch_memory(batch_size, image_size)
    settings = TrainSettings.for_device(device, precision, channels_last, compile)
    augment = recipe(image_size, augment_load)
    net = build_model(model)  # fail early on a bad model, before measuring anything
    spec = resolve_data(data)
    workers = assumed_workers(device) if workers is None else workers
    desc, loader = make_pipeline(spec, batch_size, workers, augment, device)
    try:
        note(f"measuring the loader alone: {desc} …")
        loader_rate = measure_loader(loader, seconds=seconds)
        if len(loader_rate.batch_shape) != 4:
            raise MeasureError(
                f"--data {data}: batches of images have shape {loader_rate.batch_shape}; "
                "expected N×C×H×W image tensors"
            )
        nw = getattr(loader, "num_workers", workers)
        with cpu_threads_beside(nw, device) as threads:
            where = f"{device}, {count(threads, 'thread')}" if device == "cpu" else device
            note(
                f"measuring the model alone: {model}, batch {loader_rate.batch_shape[0]}, on {where}, "
                f"{settings.describe()} …"
            )
            model_rate = measure_model(
                net, loader_rate.batch_shape, device, seconds=seconds, settings=settings
            )
            note("measuring both together: the model trained on the loader's batches …")
            _, _, h, w = loader_rate.batch_shape
            classes = model_classes(net, h, w, device)
            together = measure_together(
                net, loader, device, seconds=seconds, settings=settings, classes=classes
            )
        result = Diagnosis(
            data, desc, model, device, loader_rate, model_rate, together=together, settings=settings
        )
        if spec.kind != "function":
            result.augment_load = augment_load
        if device == "cpu":
            result.threads = threads
        if result.input_bound:

            def train(alternative: Any) -> Rate:
                return measure_together(
                    net, alternative, device, seconds=seconds, settings=settings, classes=classes
                )

            with tempfile.TemporaryDirectory(prefix="gpufeed-diagnose-") as tmp:
                result.alternatives = alternatives(
                    spec, loader, workers, batch_size, augment, device, seconds, Path(tmp), note,
                    train=train,
                )  # fmt: skip
            if device == "cpu":
                _alternative_ceilings(result, net, seconds, note)
    finally:
        _close(loader)
    result.offload, result.offload_from = _offload(result, nw)
    return result


def _offload(d: Diagnosis, workers: int) -> tuple[OffloadAdvice, str]:
    """Would a Ray cluster's CPU nodes help (advise/offload.py), and the pipeline it is sized from:
    the measured alternative that Loader(cluster=...) runs, a gpufeed Loader preprocessing on the
    CPU, where there is one, else the job's loader (`workers`: its workers)."""
    from gpufeed.advise.offload import offload_advice
    from gpufeed.cores import usable_cores

    host, hw = max(1, usable_cores() - 1), tuple(d.loader.batch_shape[-2:])
    a = next((a for a in d.alternatives if a.cluster_pipeline), None)
    if a is None:
        rates = (d.loader.images_per_s, workers, d.model_rate.images_per_s)
        wait = d.together.data_wait_share if d.together is not None else math.nan
        advice = offload_advice(*rates, host, hw, d.loader.cpu_s_per_image, wait)
        return advice, d.loader_desc
    # beside training the loader gets the host's cores, not the training process's one too: an
    # alternative that kept up with the model on them needs no remote cores
    rates = (a.images_per_s, min(a.workers or 0, host), d.ceiling_beside(a))
    return offload_advice(*rates, host, hw, a.cpu_s_per_image), a.name
