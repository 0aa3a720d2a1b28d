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
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufeed.advise.inputs import SAMPLE_IMAGES, DataSpec, pack_sample, resolve_data
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
    measure_model,
    measure_together,
    model_classes,
    recipe,
    recipe_name,
)
from gpufeed.advise.progress import progress_notes
from gpufeed.devices import default_device
from gpufeed.text import count

if TYPE_CHECKING:
    from rich.console import Group

    from gpufeed.advise.offload import OffloadAdvice
    from gpufeed.data.augment import Augment


@dataclass
class Alternative:
    """A measured way to feed the model faster, and the model's ceiling beside it."""

    name: str
    images_per_s: float
    workers: int | None = None  # its loader workers
    cpu_s_per_image: float = math.nan  # CPU an image cost it, measured alone (data.rate.Rate)
    cluster_pipeline: bool = False  # what Loader(cluster=...) runs (CPU preprocessing)
    threads: int | None = None  # on a CPU device, the torch threads its workers leave the model
    ceiling: float | None = None  # the model alone timed with `threads`; None: the diagnosis's
    trained: Rate | None = None  # GPU preprocessing: the model trained on its batches (together)


@dataclass
class Diagnosis:
    """The two measurements, the verdict they give, and measured alternatives when input-bound."""

    data: str
    loader_desc: str
    model: str
    device: str
    loader: Rate
    model_rate: Rate
    alternatives: list[Alternative] = field(default_factory=list)
    threads: int | None = None  # torch threads of the model measurement on a CPU device
    together: Rate | None = None  # the model trained on the loader's batches
    settings: TrainSettings = field(default_factory=TrainSettings)
    offload: OffloadAdvice | None = None  # would a Ray cluster's CPU nodes help (advise/offload.py)
    augment_load: int | None = None  # the recipe's load (measure.recipe); None: the user's loader
    offload_from: str | None = None  # the pipeline whose CPU per image sized `offload`

    def __rich__(self) -> Group:
        """The two measurements, the verdict, the alternatives as a table and the offload advice."""
        return _render(self)

    @property
    def end_to_end(self) -> float:
        """Images/s of the job as it would run: together, else the slower side alone."""
        if self.together is not None:
            return self.together.images_per_s
        return min(self.loader.images_per_s, self.model_rate.images_per_s)

    @property
    def ceiling_share(self) -> float:
        """End-to-end images/s as a share of the model-alone ceiling (capped at 1)."""
        return min(1.0, self.end_to_end / self.model_rate.images_per_s)

    @property
    def input_bound(self) -> bool:
        if self.together is not None and math.isfinite(self.together.data_wait_share):
            return self.together.data_wait_share >= WAITING
        return self.loader.images_per_s < self.model_rate.images_per_s

    @property
    def verdict(self) -> str:
        return "input-bound" if self.input_bound else "compute-bound"

    @property
    def ratio(self) -> float:
        """How many times faster the faster side is than the slower one."""
        a, b = self.loader.images_per_s, self.model_rate.images_per_s
        return max(a, b) / min(a, b)

    def ceiling_beside(self, a: Alternative) -> float:
        """Images/s of the model alone beside alternative `a`: what its verdict compares with."""
        return self.model_rate.images_per_s if a.ceiling is None else a.ceiling

    def verdict_with(self, a: Alternative) -> str:
        """The verdict the job would get with alternative `a` as its loader: from training on it
        where that was measured (as the job's own verdict), else from its rate alone."""
        if a.trained is not None and math.isfinite(a.trained.data_wait_share):
            return "input-bound" if a.trained.data_wait_share >= WAITING else "compute-bound"
        return "input-bound" if a.images_per_s < self.ceiling_beside(a) else "compute-bound"

    def offload_text(self) -> str:
        """The offload advice's line, naming the pipeline whose CPU per image sized it."""
        assert self.offload is not None
        text = self.offload.text()
        return f"{text}; CPU/image measured on {self.offload_from}" if self.offload_from else text

    @property
    def gpu_idle_share(self) -> float:
        """Share of time the accelerator waits for data: 1 − end-to-end / ceiling."""
        return 1.0 - self.ceiling_share

    def to_dict(self) -> dict[str, Any]:
        return {
            "data": self.data,
            "loader": self.loader_desc,
            "augment_load": self.augment_load,
            "model": self.model,
            "device": self.device,
            "threads": self.threads,
            "loader_images_per_s": self.loader.images_per_s,
            "model_images_per_s": self.model_rate.images_per_s,
            "together_images_per_s": self.together.images_per_s if self.together else None,
            "ceiling_share": self.ceiling_share,
            "together_data_wait_share": self.together.data_wait_share if self.together else None,
            "settings": vars(self.settings),
            "batch_shape": list(self.loader.batch_shape),
            "verdict": self.verdict,
            "ratio": self.ratio,
            "gpu_idle_share": self.gpu_idle_share,
            "alternatives": [_alternative_dict(a) for a in self.alternatives],
            "offload": None if self.offload is None else _offload_dict(self),
        }


def _alternative_dict(a: Alternative) -> dict[str, Any]:
    """An alternative's fields, with what training on it measured as two numbers."""
    out = {k: v for k, v in vars(a).items() if k != "trained"}
    out["trained_images_per_s"] = a.trained.images_per_s if a.trained else None
    out["trained_data_wait_share"] = a.trained.data_wait_share if a.trained else None
    return out


def _offload_dict(d: Diagnosis) -> dict[str, Any]:
    """The offload advice's inputs, conclusions, the pipeline it was sized from and its line."""
    advice = d.offload
    assert advice is not None
    return {
        "cpu_s_per_image": advice.cpu_s_per_image,
        "model_images_per_s": advice.model_images_per_s,
        "host_cores": advice.host_cores,
        "image_bytes": advice.image_bytes,
        "data_wait_share": advice.data_wait_share,
        "cores_needed": advice.cores_needed,
        "helps": advice.helps,
        "remote_cores": advice.remote_cores,
        "network_bytes_per_s": advice.network_bytes_per_s,
        "sized_from": d.offload_from,
        "text": d.offload_text(),
    }


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


def _trained_cell(trained: Rate | None, ceiling: float) -> str:
    """'3,606.0 (77% of the model alone)', or '—' where it was not trained on."""
    if trained is None:
        return "—"
    return f"{trained.images_per_s:,.1f} ({trained.images_per_s / ceiling:.0%} of the model alone)"


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


def _render(d: Diagnosis) -> Group:
    """`Diagnosis.__rich__`: what `gpufeed diagnose` prints at the end."""
    from rich.console import Group
    from rich.markup import escape
    from rich.table import Table

    parts: list[Any] = []

    shape = "×".join(str(x) for x in d.loader.batch_shape)
    title = f"gpufeed diagnose: {escape(d.data)}"
    if d.augment_load is not None:
        title += f" · {recipe_name(d.augment_load)}"
    table = Table(title=title, title_justify="left")
    table.add_column("measured")
    table.add_column("images/s", justify="right")
    table.add_row(f"loader alone: {escape(d.loader_desc)}", f"{d.loader.images_per_s:,.1f}")
    table.add_row(
        f"model alone (the ceiling): {escape(d.model)} on {d.device}"
        + (f" ({count(d.threads, 'thread')})" if d.threads else "")
        + f", batch {shape}, {d.settings.describe()}",
        f"{d.model_rate.images_per_s:,.1f}",
    )
    if d.together is not None:
        table.add_row("both together (end to end)", f"{d.together.images_per_s:,.1f}")
    parts.append(table)
    color = "red" if d.input_bound else "green"
    accel = "GPU" if d.device == "cuda" else "accelerator"
    if d.input_bound:
        why = (
            "the loader alone is slower than the model"
            if d.loader.images_per_s < d.model_rate.images_per_s
            else "each is fast alone, but together they stall (CPU, copies, memory bandwidth)"
        )
        text = f"training runs at {d.ceiling_share:.0%} of the model's ceiling"
        if d.together is not None and math.isfinite(d.together.data_wait_share):
            text += f", its steps wait for data {d.together.data_wait_share:.0%} of the time"
        text += f": {why}"
    else:
        text = (
            f"training reaches {d.ceiling_share:.0%} of the model's ceiling: the model is the limit"
        )
    parts.append(
        f"[bold {color}]{d.verdict.upper()}[/]: {text}"
        + (f"; the {accel} idles about {d.gpu_idle_share:.0%} of the time" if d.input_bound else "")
    )
    if d.alternatives:
        title = "Measured alternatives (images/s: the loader alone)"
        alt = Table(title=title, title_justify="left")
        alt.add_column("alternative")
        alt.add_column("images/s", justify="right")
        alt.add_column("vs now", justify="right")
        beside = any(a.threads is not None for a in d.alternatives)
        if beside:  # a CPU device: the model trains with the threads the workers leave
            alt.add_column("model beside its workers", justify="right")
        trained = any(a.trained is not None for a in d.alternatives)
        if trained:  # GPU preprocessing: the model trained on its batches
            alt.add_column("trained on it", justify="right")
        alt.add_column("verdict with it")
        for a in d.alternatives:
            row = [
                escape(a.name),
                f"{a.images_per_s:,.1f}",
                f"×{a.images_per_s / d.loader.images_per_s:.2f}",
            ]
            if beside:
                threads = f" ({count(a.threads, 'thread')})" if a.threads else ""
                row.append(f"{d.ceiling_beside(a):,.1f}{threads}")
            if trained:
                row.append(_trained_cell(a.trained, d.model_rate.images_per_s))
            alt.add_row(*row, d.verdict_with(a))
        parts.append(alt)
    elif d.input_bound:
        parts.append("  no alternative applies to this loader")
    if d.offload is not None:
        parts.append(d.offload_text())
    return Group(*parts)
