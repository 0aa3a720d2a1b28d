"""Lend CPU batches straight from their host slots: when the device is the CPU, a worker writes
the final batch into its slot, so the training loop can take the slot itself instead of a copy.

Copying a 64×3×224×224 float batch out of its slot cost the training process 0.11 ms per image
on a 2-core VM (6% of the whole loader's CPU). A lent slot goes back to its worker only once
nothing outside the loader references it: each slot is lent as a tensor over a storage of its
own (aliasing the slot's shared memory and keeping it mapped), whose use count says whether the
loop, or any view, slice or numpy array of the batch, still holds it (as `outputs.OutputPool`).
A worker always keeps `reserve` slots that are not lent; past that, batches are copied out as
before, so a loop that keeps every batch slows down but never stalls its workers.
"""

from __future__ import annotations

import threading
from collections import Counter

import torch

from gpufeed.data.outputs import only_pooled
from gpufeed.data.slots import Slots


def _alias(images: torch.Tensor) -> torch.Tensor:
    """The same memory as `images`, over a storage of its own that keeps `images` alive."""
    if images.dtype == torch.bfloat16:  # numpy has no bfloat16: alias the bits, view them back
        return torch.from_numpy(images.view(torch.int16).numpy()).view(torch.bfloat16)
    return torch.from_numpy(images.numpy())


class Lender:
    """Which slots the training loop holds (main process; thread-safe)."""

    def __init__(self, slots: Slots, reserve: int = 1) -> None:
        self.slots, self.reserve = slots, reserve
        self._aliases: dict[int, torch.Tensor] = {}
        self._out: dict[int, tuple[int, int]] = {}  # slot index -> (worker, slot)
        self._per_worker: Counter[int] = Counter()
        self._lock = threading.Lock()
        self.lent = self.copied = 0  # batches handed out as their slot / as a copy

    def lend(self, worker: int, slot: int) -> torch.Tensor | None:
        """Slot `slot` of `worker`'s images (N × the slot's shape) to hand out as the batch, or
        None when lending it would leave the worker fewer than `reserve` slots (copy it then)."""
        with self._lock:
            if self._per_worker[worker] >= self.slots.per_worker - self.reserve:
                self.copied += 1
                return None
            index = self.slots.index(worker, slot)
            alias = self._aliases.get(index)
            if alias is None:
                alias = self._aliases[index] = _alias(self.slots.images[index])
            self._out[index] = (worker, slot)
            self._per_worker[worker] += 1
            self.lent += 1
            return alias[:]  # a view: the alias itself stays the lender's own reference

    def cancel(self, worker: int, slot: int) -> None:
        """Take back a lend whose batch was never handed out (its making failed)."""
        with self._lock:
            if self._out.pop(self.slots.index(worker, slot), None) is not None:
                self._per_worker[worker] -= 1
                self.lent -= 1

    def returned(self) -> list[tuple[int, int]]:
        """(worker, slot) of every lent slot nothing outside holds any more; they are no
        longer counted as lent, and go back to their workers."""
        with self._lock:
            back = [i for i in self._out if only_pooled(self._aliases[i])]
            done = [self._out.pop(i) for i in back]
            for worker, _ in done:
                self._per_worker[worker] -= 1
            return done

    @property
    def out(self) -> int:
        """Slots lent now."""
        return len(self._out)
