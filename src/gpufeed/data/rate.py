"""The one way gpufeed measures a data loader: images/s it delivers on its own, after a warm-up.

Used by the Loader's own CPU-or-GPU choice, by `diagnose` and `tune`, and by the benchmarks.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from gpufeed.data.forking import frozen_heap
from gpufeed.errors import GpufeedError

__all__ = ["MeasureError", "Rate", "guarded", "images_of", "measure_loader", "tree_cpu_seconds"]


class MeasureError(GpufeedError, ValueError):
    """A loader, model or `module:function` that cannot be measured; the message says what to do."""


@dataclass
class Rate:
    """Images delivered (or trained) per second after the warm-up, and the batch shape seen."""

    images: int
    seconds: float
    batch_shape: tuple[int, ...] = ()
    data_wait_share: float = math.nan  # training on a loader: share of step time blocked on it
    cpu_seconds: float = math.nan  # CPU time of this process and its children (workers) meanwhile

    @property
    def images_per_s(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else math.nan

    @property
    def cpu_s_per_image(self) -> float:
        """CPU seconds an image cost, on all the cores the loader used (NaN where not measured)."""
        return self.cpu_seconds / self.images if self.images > 0 else math.nan


def tree_cpu_seconds() -> float:
    """CPU seconds used so far by this process and every process under it, those that ended and
    were waited for included (Linux adds them to their parent's children times)."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def measure_loader(
    loader: Iterable[Any], seconds: float = 4.0, max_batches: int = 200, warmup: int = 1
) -> Rate:
    """Iterate `loader` with nothing else running: images/s after `warmup` batches (worker start,
    first decode), for `seconds` or `max_batches` batches, starting new epochs as needed (their
    start-up counts, as it does in training), and the CPU time it took meanwhile."""
    shape: tuple[int, ...] = ()
    images = batches = 0
    t0 = None
    while True:
        try:
            with frozen_heap():  # torch's DataLoader forks here too: see gpufeed.data.forking
                it = iter(loader)
        except Exception as e:
            raise MeasureError(f"the data loader failed to start: {type(e).__name__}: {e}") from e
        got = False
        try:
            for batch in guarded(it):
                got = True
                x = images_of(batch)
                shape = tuple(x.shape)
                if t0 is None:
                    warmup -= 1
                    if warmup <= 0:
                        _settle(x)
                        t0, cpu0 = time.perf_counter(), tree_cpu_seconds()
                    continue
                images += int(x.shape[0])
                batches += 1
                if batches >= max_batches or time.perf_counter() - t0 >= seconds:
                    _settle(x)
                    cpu = tree_cpu_seconds() - cpu0
                    return Rate(images, time.perf_counter() - t0, shape, cpu_seconds=cpu)
        finally:
            if hasattr(it, "close"):  # a generator (gpufeed Loader): stops its workers now
                it.close()
        if not got:
            raise MeasureError("the data loader yielded no batch: give it data or a smaller batch")


def guarded(it: Iterator[Any]) -> Iterator[Any]:
    """The loader's batches; an exception inside the loader becomes a MeasureError saying so."""
    while True:
        try:
            batch = next(it)
        except StopIteration:
            return
        except Exception as e:
            raise MeasureError(f"the data loader raised {_error_line(e)}") from e
        yield batch


def _error_line(e: Exception) -> str:
    """'Type: message'. torch re-raises a worker's exception with the worker's whole traceback in
    its message: that becomes the original exception's own last line, and where it was raised."""
    text = str(e)
    if "Original Traceback" in text:
        return f"{text.strip().splitlines()[-1]} (in a loader worker process)"
    return f"{type(e).__name__}: {text}"


def _settle(images: Any) -> None:
    """Wait for the device work queued so far, so the clock covers the loader's device stage."""
    if getattr(images, "is_cuda", False):
        import torch

        torch.cuda.synchronize(images.device)


def images_of(batch: Any) -> Any:
    """The images of a batch: `(images, labels)` or `{"images": ..., "labels": ...}`."""
    if isinstance(batch, dict) and "images" in batch:
        return batch["images"]
    if isinstance(batch, (tuple, list)) and batch and hasattr(batch[0], "shape"):
        return batch[0]
    raise MeasureError(
        f"the data loader yielded a {type(batch).__name__}; it must yield (images, labels) "
        "pairs or dicts with 'images' and 'labels'"
    )
