"""Host slots: the shared-memory batches workers fill and the device stage reads, made once.

Each worker owns `per_worker` slots. A slot goes to the main process when its batch is ready and
comes back once the device stage has copied it, so nothing is allocated, paged in or pickled per
batch. On CUDA the main process page-locks every slot once (`cudaHostRegister`, after the workers
are forked), so host-to-device copies are DMA straight from the slot, with no staging copy.
"""

from __future__ import annotations

import math

import torch

from gpufeed.data.spec import BatchSpec


def shared_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero-filled tensor made straight in shared memory. `empty().share_memory_()` would
    allocate it privately first and then copy it over (0.3 s for 230 MB of slots, at every
    start); a new shared-memory file is zero pages that fault in where they are first written."""
    nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    new_shared = getattr(torch.UntypedStorage, "_new_shared", None)
    if new_shared is None:  # a torch without it: the public, copying way
        return torch.zeros(shape, dtype=dtype).share_memory_()
    storage = new_shared(nbytes)
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape)


class Slots:
    """`workers × per_worker` slots laid out as `spec` says, in shared memory."""

    def __init__(self, spec: BatchSpec, workers: int, per_worker: int) -> None:
        self.spec, self.workers, self.per_worker = spec, max(1, workers), per_worker
        count = self.workers * per_worker
        b = spec.batch_size
        encoded = spec.handoff == "encoded"
        if encoded:
            self.images = shared_zeros((count, spec.image_bytes), torch.uint8)
        else:
            self.images = shared_zeros((count, *spec.host_shape), spec.host_dtype)
        self.labels = shared_zeros((count, b), torch.int64)
        self.offsets = shared_zeros((count, b + 1 if encoded else 0), torch.int64)
        cols = spec.param_columns
        self.params = shared_zeros((count, b if cols else 0, cols), torch.float64)
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
        for t in (self.images, self.labels, self.params):
            nbytes = t.numel() * t.element_size()
            if nbytes == 0:
                continue
            # cudaHostRegisterPortable: page-locked for every device's context, not only the
            # one current here (Loader(device="cuda:1") without torch.cuda.set_device)
            err = cudart.cudaHostRegister(t.data_ptr(), nbytes, 1)
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
