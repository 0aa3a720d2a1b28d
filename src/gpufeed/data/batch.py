"""Turn a list of raw samples into one augmented batch; shared by the CPU-worker and device paths."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from gpufeed.data.decode import CorruptImage, decode, image_size

if TYPE_CHECKING:
    import torch

    from gpufeed.data.augment import Augment
    from gpufeed.data.dataset import RawSample

# decode(list of bytes, list of (min_h, min_w)) -> per image: HxWx3 uint8 tensor or an Exception
Decoder = Callable[[Sequence[bytes], Sequence[tuple[int, int]]], list]


class CorruptSampleError(ValueError):
    """strict=True: a sample could not be decoded; names its shard and key."""


def batch_generator(seed: int, epoch: int, rank: int, worker: int, first: int) -> torch.Generator:
    """The generator for one batch's random parameters, identical on every path and device."""
    import torch

    state = np.random.SeedSequence([seed, epoch, rank, worker, first]).generate_state(1)[0]
    return torch.Generator().manual_seed(int(state))


def cpu_decoder(datas: Sequence[bytes], min_sizes: Sequence[tuple[int, int]]) -> list:
    """libjpeg-turbo (DCT-scaled to the minimum size) / Pillow, one image at a time."""
    import torch

    out: list = []
    for data, (mh, mw) in zip(datas, min_sizes, strict=True):
        try:
            out.append(torch.from_numpy(decode(data, mh, mw)))
        except CorruptImage as e:
            out.append(e)
    return out


def new_batch(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str, channels_last: bool
) -> torch.Tensor:
    """An empty output batch; inside a DataLoader worker it is allocated in shared memory, as
    torch's default_collate does, so handing it to the main process copies nothing."""
    import torch
    import torch.utils.data

    device = torch.device(device)
    if device.type != "cpu" or torch.utils.data.get_worker_info() is None:
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        return torch.empty(shape, dtype=dtype, device=device, memory_format=fmt)
    return _as_batch(_shared_flat(int(np.prod(shape)), dtype), shape, channels_last)


class SharedBatchBuffers:
    """Output batches that go back to their worker once the main process holds no reference.

    A fresh shared-memory batch costs its worker ~0.2 ms per 224² image in page faults; reusing
    it does not. Each worker owns `slots` buffers; a shared byte per (worker, slot) says whether
    the main process may still be using it (1) or the worker may overwrite it (0). The main
    process clears it when a weak reference to the storage it received has expired, so a batch
    the training loop still holds (or any view of it) is never overwritten. With every slot in
    use the worker takes a fresh batch: nothing ever waits.
    """

    def __init__(self, workers: int, slots: int) -> None:
        import torch

        self.slots = slots
        self.in_use = torch.zeros(max(1, workers), slots, dtype=torch.uint8).share_memory_()
        self._mine: dict[int, torch.Tensor] = {}  # worker side: slot -> flat buffer
        self._held: list[tuple[int, int, Any]] = []  # main side: (worker, slot, weak ref)

    def take(
        self,
        worker: int,
        shape: tuple[int, ...],
        dtype: torch.dtype,
        channels_last: bool,
        capacity: int,
        tag: int = 1,
    ) -> tuple[torch.Tensor, int, bool]:
        """(a batch of `shape` in shared memory, its slot or -1, whether the buffer was used
        before); `capacity`: elements to allocate per buffer, so that one fits every batch;
        `tag` (1-255) marks the slot with the iteration taking it (see `reclaim`)."""
        flags = self.in_use[worker].numpy()
        numel = int(np.prod(shape))
        for k in range(self.slots):
            if flags[k] == 0:
                buf = self._mine.get(k)
                reused = buf is not None and buf.dtype == dtype and buf.numel() >= numel
                if not reused:
                    buf = self._mine[k] = _shared_flat(max(numel, capacity), dtype)
                flags[k] = tag
                return _as_batch(buf[:numel], shape, channels_last), k, reused
        return _as_batch(_shared_flat(numel, dtype), shape, channels_last), -1, False

    def hold(self, worker: int, slot: int, images: torch.Tensor) -> None:
        """Main process: `images` arrived in (worker, slot); the slot stays taken while it lives."""
        from torch.multiprocessing.reductions import StorageWeakRef

        if slot >= 0:
            self._held.append((worker, slot, StorageWeakRef(images.untyped_storage())))

    def release_unused(self) -> None:
        """Main process: give back to their workers the buffers nothing here references any more."""
        held = []
        for worker, slot, ref in self._held:
            if ref.expired():
                self.in_use[worker, slot] = 0
            else:
                held.append((worker, slot, ref))
        self._held = held

    def reclaim(self, tag: int) -> None:
        """Main process, once the workers run iteration `tag`: free the slots of batches an
        abandoned earlier iteration produced but never delivered (nothing here can hold them)."""
        held = {(w, k) for w, k, _ in self._held}
        flags = self.in_use.numpy()
        for w, k in zip(*np.nonzero((flags != 0) & (flags != tag)), strict=True):
            if (int(w), int(k)) not in held:
                flags[w, k] = 0


def _shared_flat(numel: int, dtype: torch.dtype) -> torch.Tensor:
    import torch

    storage = torch.empty(0, dtype=dtype)._typed_storage()._new_shared(numel, device="cpu")
    return torch.empty(0, dtype=dtype).set_(storage)


def _as_batch(flat: torch.Tensor, shape: tuple[int, ...], channels_last: bool) -> torch.Tensor:
    if not channels_last:
        return flat.view(shape)
    n, c, h, w = shape
    return flat.view(n, h, w, c).permute(0, 3, 1, 2)  # NCHW indexing, channels_last layout


def build_batch(
    samples: Sequence[RawSample],
    augment: Augment,
    gen: torch.Generator,
    *,
    dtype: torch.dtype,
    channels_last: bool,
    strict: bool,
    decoder: Decoder = cpu_decoder,
    device: torch.device | str = "cpu",
    per_image: bool | None = None,
    alloc: Callable[[tuple[int, ...]], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, list[tuple[str, str, str]]]:
    """(images N×3×H×W, labels N, corrupt [(shard, key, reason)]); corrupt samples are left out.

    Random parameters are drawn for every sample, corrupt or not, so a bad image never shifts
    the augmentations of the others. `per_image` (default: on CPU) takes each image through all
    its steps while it is in cache, into its slot of the output batch; otherwise the steps
    after the first resampling run batched (fewer kernel launches on a GPU). Same result.
    `alloc(shape)` gives the output batch (default: `new_batch`).
    """
    import torch

    n = len(samples)
    sizes: list[tuple[int, int] | Exception] = []
    for s in samples:
        try:
            sizes.append(image_size(s.data))
        except CorruptImage as e:
            sizes.append(e)
    safe = [sz if isinstance(sz, tuple) else (1, 1) for sz in sizes]
    boxes = augment.boxes(safe, gen)
    warps = [
        w.to(device, non_blocking=True) for w in augment.warps(augment.flips_and_angles(n, gen))
    ]
    ok = [i for i in range(n) if isinstance(sizes[i], tuple)]
    decoded = decoder(
        [samples[i].data for i in ok], [augment.min_decode_size(safe[i], boxes[i]) for i in ok]
    )
    corrupt = [(samples[i].shard, samples[i].key, str(sizes[i])) for i in range(n) if i not in ok]
    keep, images = [], []
    for i, img in zip(ok, decoded, strict=True):
        if isinstance(img, Exception):
            corrupt.append((samples[i].shard, samples[i].key, str(img)))
        else:
            keep.append(i)
            images.append(img)
    if corrupt and strict:
        shard, key, why = corrupt[0]
        raise CorruptSampleError(f"corrupt sample in shard {shard}, key {key}: {why}")
    shape = (len(keep), 3, *augment.size)
    out = alloc(shape) if alloc else new_batch(shape, dtype, device, channels_last)
    if per_image is None:
        per_image = torch.device(device).type == "cpu"
    firsts = []
    for j, (i, img) in enumerate(zip(keep, images, strict=True)):
        x = augment.first_pass(img, safe[i], boxes[i], warps, i)
        if per_image:
            augment.finish(x, [w[i : i + 1] for w in warps[1:]], out[j : j + 1], owned=True)
        else:
            firsts.append(x)
    if firsts:
        idx = torch.tensor(keep, dtype=torch.long)
        augment.finish(torch.cat(firsts), [w[idx] for w in warps[1:]], out, owned=True)
    labels = torch.tensor([samples[i].label for i in keep], dtype=torch.long)
    return out, labels, corrupt
