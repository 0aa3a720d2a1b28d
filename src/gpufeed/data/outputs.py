"""Output batches on the CPU, reused once the training loop has let go of them.

A fresh 64×3×224×224 float batch is 38.5 MB of new pages: on a 2-core VM the page faults cost
about as much again as copying the batch out of its slot. The pool hands out views of a few
buffers and takes a buffer again only when nothing but the pool references its storage, so a
batch the training loop keeps (or any view, slice or numpy array of it) is never overwritten.
"""

from __future__ import annotations

from typing import Any

import torch

# c10's count of tensors sharing a storage; without it (another torch) nothing is reused
_use_count: Any = getattr(torch._C, "_storage_Use_Count", None)


def use_counts() -> bool:
    """Whether this torch tells how many tensors hold a storage (without it nothing is reused)."""
    return _use_count is not None


def only_pooled(buf: torch.Tensor) -> bool:
    """Nothing but `buf` itself holds its storage (the temporary storage object counts one)."""
    return _use_count is not None and _use_count(buf.untyped_storage()._cdata) == 2


class OutputPool:
    """At most `keep` reusable CPU buffers; `take` gives a view of a free one, or of a new one."""

    def __init__(self, keep: int) -> None:
        self.keep = max(1, keep)
        self._bufs: list[torch.Tensor] = []
        self.reused = 0

    def take(
        self, shape: tuple[int, ...], dtype: torch.dtype, memory_format: torch.memory_format
    ) -> torch.Tensor:
        """An uninitialized `shape` batch (a view of a pooled buffer: never the buffer itself,
        so a batch the loop still holds always counts)."""
        for buf in self._bufs:
            if (
                buf.dtype == dtype
                and buf.shape[1:] == shape[1:]
                and buf.shape[0] >= shape[0]
                and buf.is_contiguous(memory_format=memory_format)
                and only_pooled(buf)
            ):
                self.reused += 1
                return buf[: shape[0]]
        buf = torch.empty(shape, dtype=dtype, memory_format=memory_format)
        if len(self._bufs) >= self.keep:
            self._bufs.pop(0)  # the oldest is the training loop's now, to keep or drop
        self._bufs.append(buf)
        return buf[: shape[0]]
