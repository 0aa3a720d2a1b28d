"""Short measurements shared by `diagnose` and `tune`: a model alone, a model trained on a loader,
the augmentation recipe both measure with, and the user's own objects named as `module:function`
(or `path/to/file.py:function`). A loader alone is measured by
`gpufeed.data.rate.measure_loader`, re-exported here."""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufeed.data.forking import frozen_heap
from gpufeed.data.rate import MeasureError, Rate, guarded, images_of, measure_loader

if TYPE_CHECKING:
    from gpufeed.data.augment import Augment

__all__ = ["MeasureError", "Rate", "measure_loader", "measure_model", "measure_together"]

# steps waiting for data this share of step time or more, end to end: input-bound (the rules'
# INPUT_BOUND); less: the loader keeps up
WAITING = 0.1


def measure_model(
    model: Any,
    batch_shape: tuple[int, ...],
    device: str,
    seconds: float = 4.0,
    max_steps: int = 500,
    warmup: int = 3,
    settings: TrainSettings | None = None,
) -> Rate:
    """Forward + backward + optimizer step on one batch resident on `device` (no input pipeline):
    the model-only ceiling, in images/s, with the job's precision, memory format and compile."""
    from gpufeed.train.loop import SyntheticData

    n, _, h, w = batch_shape
    try:
        model = model.to(device)
        classes = model_classes(model, h, w, device)
        data = SyntheticData(n, h, classes, steps=max_steps + warmup, image_width=w)
        result = _fit(model, data, device, seconds, max_steps, warmup, settings)
    except Exception as e:
        raise MeasureError(
            f"the model failed to train on a batch of shape {tuple(batch_shape)}: "
            f"{type(e).__name__}: {e}"
        ) from e
    images = result.measured_steps * n
    return Rate(images, images / result.images_per_s, tuple(batch_shape))


def measure_together(
    model: Any, loader: Iterable[Any], device: str, seconds: float = 4.0, **options: Any
) -> Rate:
    """The model trained on the loader's batches, as the job trains: the end-to-end images/s. Loader
    and model may each be fast alone and still stall together (CPU, memory bandwidth, copies).
    `options`: max_steps, warmup and settings as for `measure_model`; classes, the model's number
    of classes when known (else found from the first batch, a forward that then counts as wait)."""
    max_steps, warmup = options.get("max_steps", 500), options.get("warmup", 3)
    settings: TrainSettings | None = options.get("settings")
    known: int | None = options.get("classes")
    shape: list[tuple[int, ...]] = []

    def batches() -> Iterator[tuple[Any, Any]]:
        classes = known
        while True:
            with frozen_heap():  # torch's DataLoader forks here too: see gpufeed.data.forking
                it = iter(loader)
            got = False
            try:
                for batch in guarded(it):
                    got = True
                    x, y = images_of(batch), _labels(batch)
                    shape[:] = [tuple(x.shape)]
                    if classes is None:
                        classes = model_classes(model, x.shape[-2], x.shape[-1], device)
                    yield x, y.long() % classes
            finally:
                if hasattr(it, "close"):
                    it.close()
            if not got:
                raise MeasureError(
                    "the data loader yielded no batch: give it data or a smaller batch"
                )

    try:
        result = _fit(model.to(device), batches(), device, seconds, max_steps, warmup, settings)
    except MeasureError:
        raise
    except Exception as e:
        raise MeasureError(
            f"training the model on the loader's batches failed: {type(e).__name__}: {e}"
        ) from e
    n = shape[0][0] if shape else 0
    images = result.measured_steps * n
    if images == 0 or not result.images_per_s > 0:
        raise MeasureError("the loader ran out before the model could be timed: give it more data")
    skip = len(result.step_times) - result.measured_steps  # warm-up, unless too few steps
    step_time = sum(result.step_times[skip:])
    wait = sum(result.data_waits[skip:]) / step_time if step_time > 0 else math.nan
    return Rate(images, images / result.images_per_s, shape[0] if shape else (), wait)


def _fit(
    model: Any,
    data: Iterable[Any],
    device: str,
    seconds: float,
    max_steps: int,
    warmup: int,
    settings: TrainSettings | None,
) -> Any:
    """`fit` quietly: the warm-up (compilation included), then at most `seconds` or `max_steps`."""
    from gpufeed.train.loop import fit

    kwargs = (settings or TrainSettings()).fit_kwargs()
    return fit(
        model,
        data,
        steps=max_steps + warmup,
        device=device,
        warmup=warmup,
        max_seconds=seconds,
        verbose=False,
        **kwargs,
    )


@dataclass
class TrainSettings:
    """How the job trains: autocast precision ("bf16", "fp16" or None), channels_last, torch.compile.
    `for_device` gives the defaults: on CUDA bf16 autocast and channels_last, on a CPU neither."""

    amp: str | None = None
    channels_last: bool = False
    compile: bool = False

    @classmethod
    def for_device(
        cls,
        device: str,
        amp: str | None = "auto",
        channels_last: bool | None = None,
        compile: bool = False,
    ) -> TrainSettings:
        cuda = device == "cuda"
        if amp == "auto":
            amp = "bf16" if cuda else None
        if amp in ("fp32", "none", ""):
            amp = None
        if amp not in (None, "bf16", "fp16"):
            raise MeasureError(f"--precision {amp!r}: choose bf16, fp16 or fp32")
        return cls(amp, cuda if channels_last is None else channels_last, compile)

    def fit_kwargs(self) -> dict[str, Any]:
        return {"amp": self.amp, "channels_last": self.channels_last, "compile": self.compile}

    def describe(self) -> str:
        parts = [self.amp or "fp32"]
        if self.channels_last:
            parts.append("channels_last")
        if self.compile:
            parts.append("compiled")
        return ", ".join(parts)


def model_classes(model: Any, h: int, w: int, device: str) -> int:
    """How many classes `model` predicts (one forward of a blank image, in eval mode, no grad);
    a MeasureError naming the image size where the model cannot take it."""
    import torch

    was = model.training
    try:
        with torch.no_grad():
            return int(model.eval()(torch.zeros(1, 3, h, w, device=device)).shape[-1])
    except Exception as e:
        raise MeasureError(
            f"the model failed on a {h}x{w} image: {type(e).__name__}: {e}; give the image size "
            "it was built for (--image-size) or another --model"
        ) from None
    finally:
        model.train(was)


def _labels(batch: Any) -> Any:
    import torch

    y = batch.get("labels") if isinstance(batch, dict) else (batch[1:2] or [None])[0]
    if y is None or not hasattr(y, "shape"):
        n = int(images_of(batch).shape[0])
        return torch.zeros(n, dtype=torch.long)
    return y


@contextmanager
def cpu_threads_beside(loader_workers: int, device: str) -> Iterator[int]:
    """On a CPU device, train with the cores the loader workers leave free (at least one), as
    training beside them would; OpenMP threads fighting workers for a core slow every op down
    many times. Yields the thread count; restores torch's setting afterwards."""
    import torch

    from gpufeed.cores import usable_cores

    before = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(max(1, usable_cores() - loader_workers))
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def load_object(spec: str, what: str) -> Any:
    """Call `module:function` (or `file.py:function`) with no arguments and return its result."""
    mod_name, sep, func_name = spec.rpartition(":")
    if not sep or not mod_name or not func_name:
        raise MeasureError(f"{what} {spec!r}: expected module:function, e.g. mytrain:make_loader")
    try:
        if mod_name.endswith(".py"):
            path = Path(mod_name)
            if not path.is_file():
                raise MeasureError(f"{what} {spec!r}: file {mod_name} does not exist")
            module = sys.modules.get(path.stem)
            if getattr(module, "__file__", None) != str(path.resolve()):
                modspec = importlib.util.spec_from_file_location(path.stem, path.resolve())
                assert modspec is not None and modspec.loader is not None
                module = importlib.util.module_from_spec(modspec)
                sys.modules[path.stem] = module
                modspec.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path:  # like `python -m`: the current directory first
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(mod_name)
    except MeasureError:
        raise
    except ImportError as e:
        raise MeasureError(f"{what} {spec!r}: cannot import {mod_name!r}: {e}") from None
    except Exception as e:
        raise MeasureError(
            f"{what} {spec!r}: importing {mod_name!r} raised {type(e).__name__}: {e}"
        ) from None
    func = getattr(module, func_name, None)
    if not callable(func):
        raise MeasureError(f"{what} {spec!r}: {mod_name} has no function {func_name!r}")
    try:
        return func()
    except Exception as e:
        raise MeasureError(f"{what} {spec!r}: calling it raised {type(e).__name__}: {e}") from None


def build_model(spec: str) -> Any:
    """A ResNet by name (resnet18/50/152, also 34/101) or the nn.Module a `module:function` returns."""
    from torch import nn

    from gpufeed.train.resnet import MODELS, resnet

    if ":" not in spec:
        try:
            return resnet(spec)
        except ValueError:
            raise MeasureError(
                f"--model {spec!r} is not known: choose one of {', '.join(MODELS)} "
                "or give module:function returning your nn.Module"
            ) from None
    model = load_object(spec, "--model")
    if not isinstance(model, nn.Module):
        raise MeasureError(f"--model {spec!r} returned a {type(model).__name__}, not an nn.Module")
    return model


def check_device(device: str) -> str:
    """'cpu' or 'cuda' (only where CUDA is available); MeasureError otherwise."""
    import torch

    if device not in ("cpu", "cuda"):
        raise MeasureError(f"--device {device!r}: choose cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise MeasureError("--device cuda: no CUDA device is available here; use --device cpu")
    return device


DEFAULT_AUGMENT_LOAD = 1


def check_batch_memory(batch_size: int, image_size: int) -> None:
    """Refuse a batch and image size that could never fit in this machine's memory (MeasureError
    naming both) before a worker dies trying to allocate it: one batch decoded (uint8), its
    augmented copy and its float32 tensor, the least any loader holds at once."""
    from gpufeed.data.budget import machine_memory

    one = batch_size * 3 * image_size * image_size  # bytes of a uint8 batch
    need, total = 6 * one, machine_memory()
    if need > total:
        raise MeasureError(
            f"--batch-size {batch_size} --image-size {image_size}: one batch of "
            f"{batch_size}×3×{image_size}×{image_size} images takes {_gib(4 * one)} as float32 "
            f"and at least {_gib(need)} while it is made, more than this machine's {_gib(total)} "
            "of memory; use a smaller --image-size or --batch-size"
        )


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def recipe(image_size: int, load: int = DEFAULT_AUGMENT_LOAD) -> Augment:
    """The augmentation `diagnose` and `tune` measure with (the naive baseline and the gpufeed
    Loader alike, so that they do the same work): load 0 is the ImageNet recipe (random-resized
    crop, horizontal flip), load L >= 1 `Augment.load_factor(L)` (crop, then L x flips and a
    rotation of up to ±15°), at the training image size."""
    from gpufeed.data.augment import Augment

    if load < 0:
        raise MeasureError(f"--augment-load must be 0 (the ImageNet recipe) or more, got {load}")
    size = (image_size, image_size)
    return Augment(size=size) if load == 0 else Augment.load_factor(load, size=size)


def recipe_name(load: int) -> str:
    """How `recipe(size, load)` is named where results are shown."""
    return "ImageNet recipe (crop, flip)" if load == 0 else f"augmentation load {load}"
