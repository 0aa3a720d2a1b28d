"""Host slots: the shared-memory batches workers fill and the device stage reads, made once.

Each worker owns `per_worker` slots. A slot goes to the main process when its batch is ready and
comes back once the device stage has copied it, so nothing is allocated, paged in or pickled per
batch. On CUDA the main process page-locks every slot once (`cudaHostRegister`, after the workers
are forked), so host-to-device copies are DMA straight from the slot, with no staging copy.
"""

from __future__ import annotations

import torch

from gpufeed.data.spec import BatchSpec


class Slots:
    """`workers × per_worker` slots laid out as `spec` says, in shared memory."""

    def __init__(self, spec: BatchSpec, workers: int, per_worker: int) -> None:
        self.spec, self.workers, self.per_worker = spec, max(1, workers), per_worker
        count = self.workers * per_worker
        b = spec.batch_size
        if spec.handoff == "decoded":
            self.images = torch.empty((count, *spec.host_shape), dtype=spec.host_dtype)
        else:
            self.images = torch.empty((count, spec.image_bytes), dtype=torch.uint8)
        self.labels = torch.empty((count, b), dtype=torch.int64)
        encoded = spec.handoff == "encoded"
        self.offsets = torch.zeros((count, b + 1 if encoded else 0), dtype=torch.int64)
        cols = spec.param_columns if encoded else 0
        self.params = torch.zeros((count, b if encoded else 0, cols), dtype=torch.float64)
        for t in (self.images, self.labels, self.offsets, self.params):
            t.share_memory_()
        self._registered: list[int] = []

    def index(self, worker: int, slot: int) -> int:
        return worker * self.per_worker + slot

    @property
    def nbytes(self) -> int:
        parts = (self.images, self.labels, self.offsets, self.params)
        return sum(t.numel() * t.element_size() for t in parts)

    def pin(self) -> bool:
        """Page-lock the slots for fast asynchronous copies (main process, after forking the
        workers: CUDA may exclude locked pages from later forks). False if CUDA refused."""
        if self._registered or not torch.cuda.is_available():
            return bool(self._registered)
        cudart = torch.cuda.cudart()
        for t in (self.images, self.labels):
            nbytes = t.numel() * t.element_size()
            err = cudart.cudaHostRegister(t.data_ptr(), nbytes, 0)
            if int(err) != 0:
                self.unpin()
                return False
            self._registered.append(t.data_ptr())
        return True

    def unpin(self) -> None:
        if not self._registered:
            return
        cudart = torch.cuda.cudart()
        for ptr in self._registered:
            cudart.cudaHostUnregister(ptr)
        self._registered = []
