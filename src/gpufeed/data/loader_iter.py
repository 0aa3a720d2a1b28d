"""The small objects a Loader hands out and checks with: the iterator of one epoch's batches
(`EpochIterator`, what `iter(loader)` returns), `loader.sampler` (`LoaderSampler`, where trainers
call `set_epoch`) and the `device` option checked (`checked_device`).

Apart from `loader` so that the Loader only wires the stages; each takes the Loader it serves.
"""

from __future__ import annotations

import time
import weakref
from typing import Any

import torch

from gpufeed.data.plan import Position
from gpufeed.devices import default_device
from gpufeed.errors import OptionError

try:  # the profiler measures data wait in DataLoader iterators' __next__: be one of them
    from torch.utils.data.dataloader import _BaseDataLoaderIter as _IterBase
except ImportError:  # pragma: no cover - a torch without it
    _IterBase = object  # type: ignore[assignment,misc]


def checked_device(device: Any) -> torch.device:
    """`device` as a torch.device this machine has (the default device where None)."""
    try:
        dev = torch.device(device or default_device())
    except (RuntimeError, TypeError):
        raise OptionError(
            f"device={device!r}: not a device PyTorch knows; pass 'cuda', 'cuda:N' or 'cpu'"
        ) from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise OptionError(
            f"device={device!r}: PyTorch sees no CUDA GPU on this machine; pass device='cpu' "
            "(or leave it out: the default is a GPU where there is one)"
        )
    return dev


class LoaderSampler:
    """`loader.sampler.set_epoch(n)`, where trainers (Lightning) look for it."""

    def __init__(self, loader: Any) -> None:
        # weak: a strong reference back would keep a dropped Loader (and its worker processes)
        # alive until the cycle collector happens to run
        self._loader = weakref.ref(loader)

    def set_epoch(self, epoch: int) -> None:
        loader = self._loader()
        if loader is not None:
            loader.set_epoch(epoch)


class EpochIterator(_IterBase):  # type: ignore[misc,valid-type]
    """One epoch's batches. Subclasses torch's DataLoader iterator base only so that profilers
    hooking DataLoader `__next__` (gpufeed's own included) see the time spent waiting here."""

    def __init__(self, loader: Any, at: Position, token: int) -> None:
        self._loader, self._at, self._token = loader, at, token
        self._end = loader.plan.batches_in(at.epoch)
        # what the base class's __next__ reads
        self._sampler_iter = iter(())
        self._num_yielded = 0
        self._profile_name = "enumerate(DataLoader)#gpufeed.Loader.__next__"
        self._dataset_kind = 0  # map-style: no length warnings
        self._IterableDataset_len_called = None
        pool = loader._pool
        self._workers = list(pool.processes) if pool is not None else []
        self._last = time.perf_counter()

    def __iter__(self) -> EpochIterator:
        return self

    def __len__(self) -> int:
        return self._end - self._at.batch

    def _next_data(self) -> tuple[Any, ...]:
        at = self._at
        if at.batch >= self._end:
            raise StopIteration
        batch = self._loader._take(self._token, at, first=self._num_yielded == 0)
        now = time.perf_counter()
        self._loader._add_seconds(now - self._last)
        self._last = now
        self._at = Position(at.epoch, at.batch + 1)
        return batch

    if _IterBase is object:  # pragma: no cover
        __next__ = _next_data
