"""`Loader`: a drop-in training-loop iterator over gpufeed shards: `for images, labels in loader:`.

Under the hood it is torch's DataLoader over an IterableDataset whose items are whole batches:
torch's worker pool already gives robust worker start/stop, error propagation, bounded
prefetch and a pinned-memory thread, and batching inside the worker lets augmentations run as
batched tensor ops there; a pool of our own would only re-implement that. Each batch carries
(worker, first plan position, samples consumed), which makes `state_dict()` exact. Workers fill
output batches in shared memory and reuse them once the training loop has let go of them
(`SharedBatchBuffers`), so a batch crosses to the main process without a copy or fresh pages.
Workers persist across epochs; each iteration tells them its epoch and resume positions through
a small shared-memory tensor (`_Control`), which they read when the iteration starts.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.utils.data

from gpufeed.data.augment import Augment
from gpufeed.data.batch import SharedBatchBuffers, batch_generator, build_batch
from gpufeed.data.dataset import ShardDataset

PREPROCESS_MODES = ("cpu", "gpu", "auto")
_STATE_KEYS = ("seed", "world_size", "rank", "num_workers", "batch_size", "samples")


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


class _Control:
    """What the main process tells persistent workers at the start of each iteration: the
    iteration number (1-255, tags output buffers), the epoch and each worker's resume position."""

    def __init__(self, workers: int) -> None:
        self.values = torch.zeros(3 + max(1, workers), dtype=torch.int64).share_memory_()

    def start(self, epoch: int, skips: list[int] | None) -> int:
        """Main process: set up the next iteration; returns its number."""
        v = self.values
        tag = int(v[0]) % 255 + 1
        v[1], v[2] = epoch, skips is not None
        v[3:] = torch.tensor(skips) if skips is not None else 0
        v[0] = tag
        return tag

    def read(self, worker: int) -> tuple[int, int, int]:
        """Worker: (iteration number, epoch, samples of the plan to skip)."""
        v = self.values.tolist()
        return v[0], v[1], (v[3 + worker] if v[2] else 0)


class _BatchStream(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """What one worker runs: its part of the plan, cut into batches; decoded+augmented in
    "cpu" mode, raw bytes in "bytes" mode (for device preprocessing)."""

    def __init__(
        self,
        loader: Loader,
        mode: str,
        control: _Control,
        buffers: SharedBatchBuffers | None = None,
    ) -> None:
        self.ds, self.mode, self.control, self.buffers = loader.dataset, mode, control, buffers
        self.batch_size, self.augment = loader.batch_size, loader.augment
        self.dtype, self.channels_last, self.strict = (
            loader.dtype,
            loader.channels_last,
            loader.strict,
        )

    def __iter__(self) -> Iterator[tuple[Any, Any, dict[str, Any]]]:
        info = torch.utils.data.get_worker_info()
        worker, num = (info.id, info.num_workers) if info is not None else (0, 1)
        tag, epoch, first = self.control.read(worker)
        self.ds.set_epoch(epoch)  # this process's copy of the dataset
        samples = self.ds.iter_worker(worker, num, skip=first)
        retried = self.ds.source.retried
        slot, reused = -1, False
        alloc = None
        if self.buffers is not None and info is not None:
            buffers, capacity = self.buffers, self.batch_size * 3 * math.prod(self.augment.size)

            def alloc(shape: tuple[int, ...]) -> torch.Tensor:
                nonlocal slot, reused
                out, slot, reused = buffers.take(
                    worker, shape, self.dtype, self.channels_last, capacity, tag
                )
                return out

        while True:
            chunk = []
            for s in samples:
                chunk.append(s)
                if len(chunk) == self.batch_size:
                    break
            if not chunk:
                return
            meta: dict[str, Any] = {"worker": worker, "first": first, "consumed": len(chunk)}
            meta["retried"], retried = self.ds.source.retried - retried, self.ds.source.retried
            if self.mode == "bytes":
                yield chunk, torch.empty(0), meta
            else:
                gen = batch_generator(self.ds.seed, self.ds.epoch, self.ds.rank, worker, first)
                images, labels, corrupt = build_batch(
                    chunk,
                    self.augment,
                    gen,
                    dtype=self.dtype,
                    channels_last=self.channels_last,
                    strict=self.strict,
                    alloc=alloc,
                )
                meta.update(corrupt=corrupt, buffer=slot, reused=reused)
                yield images, labels, meta
            first += len(chunk)


class Loader:
    """Batches of (images, labels) from gpufeed shards, decoded and augmented on CPU workers
    (`preprocess="cpu"`) or on the device (`"gpu"`), with a hard cap on host buffer memory.

    Call `set_epoch(n)` before each epoch (it seeds the shard order and shuffle). Within an
    epoch every sample of this rank is delivered exactly once, also across `state_dict()` /
    `load_state_dict()`. Each worker ends the epoch with one partial batch; a corrupt image is
    left out of its batch and counted in `stats()` (or raises with `strict=True`).
    """

    def __init__(
        self,
        data: str | os.PathLike[str] | ShardDataset,
        batch_size: int = 256,
        *,
        num_workers: int | None = None,
        prefetch: int = 2,
        preprocess: str = "cpu",
        device: Any = None,
        augment: Augment | None = None,
        dtype: Any = None,
        channels_last: bool = False,
        strict: bool = False,
        max_host_bytes: int = 4 << 30,
        max_device_bytes: int = 2 << 30,
        pin_memory: bool | None = None,
        non_blocking: bool = True,
        **dataset_options: Any,
    ) -> None:
        if preprocess not in PREPROCESS_MODES:
            raise ValueError(
                f"preprocess={preprocess!r}: choose one of {', '.join(PREPROCESS_MODES)}"
            )
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.dataset = (
            data if isinstance(data, ShardDataset) else ShardDataset(data, **dataset_options)
        )
        if isinstance(data, ShardDataset) and dataset_options:
            raise ValueError(
                f"options {sorted(dataset_options)} go to ShardDataset, which was given ready-made"
            )
        self.batch_size = batch_size
        self.num_workers = _cpu_count() if num_workers is None else num_workers
        self.augment = augment or Augment()
        self.dtype = torch.float32 if dtype is None else dtype
        self.channels_last, self.strict = channels_last, strict
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.pin_memory = (self.device.type == "cuda") if pin_memory is None else pin_memory
        self.non_blocking = non_blocking
        self.max_host_bytes, self.max_device_bytes = max_host_bytes, max_device_bytes
        self._skips: list[int] | None = None
        self._delivered = [0] * max(1, self.num_workers)
        self._stats: dict[str, Any] = {
            "images": 0,
            "batches": 0,
            "seconds": 0.0,
            "retried": 0,
            "reused_buffers": 0,
        }
        self._corrupt: list[tuple[str, str, str]] = []
        self._pools: dict[str, tuple[Any, SharedBatchBuffers | None, _Control]] = {}
        self.preprocess, self.preprocess_reason = self._choose(preprocess)
        self.prefetch = self._bound_prefetch(prefetch)

    # --- sizing ------------------------------------------------------------------------------------

    def _batch_bytes(self, mode: str) -> int:
        if mode == "gpu":
            return self.batch_size * self.dataset.max_sample_bytes()
        h, w = self.augment.size
        item = self.dtype.itemsize if hasattr(self.dtype, "itemsize") else 4
        return self.batch_size * (3 * h * w * item + 8)

    def host_bytes_bound(self, prefetch: int) -> int:
        """Most host memory the loader's buffers can hold with this prefetch depth."""
        batch = self._batch_bytes(self.preprocess)
        nw = max(1, self.num_workers)
        src = self.dataset.source
        per_worker = self.dataset.shuffle_buffer * self.dataset.max_sample_bytes()
        if src.remote:
            per_worker += (src.read_ahead + 2) * src.chunk_size
        if self.preprocess == "cpu":  # the batch being filled (images are done one at a time)
            per_worker += batch
        queued = (nw * prefetch if self.num_workers > 0 else 0) + 2  # + pin thread + in hand
        return nw * per_worker + queued * batch

    def _bound_prefetch(self, prefetch: int) -> int:
        prefetch = max(1, prefetch)
        while prefetch > 1 and self.host_bytes_bound(prefetch) > self.max_host_bytes:
            prefetch -= 1
        need = self.host_bytes_bound(prefetch)
        if need > self.max_host_bytes:
            raise ValueError(
                f"max_host_bytes={self.max_host_bytes:,} is too small: {max(1, self.num_workers)} "
                f"worker(s) with shuffle_buffer={self.dataset.shuffle_buffer} and batches of "
                f"{self._batch_bytes(self.preprocess):,} bytes need at least {need:,} bytes; "
                "raise max_host_bytes or lower batch_size, num_workers or shuffle_buffer"
            )
        return prefetch

    def device_bytes_bound(self) -> int:
        """Device memory the gpu path holds at most: two batches in flight plus decode buffers."""
        if self.preprocess != "gpu":
            return 0
        h, w = self.augment.size
        out = self.batch_size * 3 * h * w * 4
        decoded = self.batch_size * self.dataset.max_sample_bytes() * 12  # decoded ≈ 12× JPEG size
        return 2 * (2 * out + decoded)

    def _choose(self, preprocess: str) -> tuple[str, str]:
        if preprocess != "auto":
            return preprocess, "requested"
        if not torch.cuda.is_available() or self.device.type != "cuda":
            return "cpu", "no CUDA device: preprocessing on CPU workers"
        times = {}
        for mode in ("cpu", "gpu"):
            self.preprocess = mode
            self.prefetch = self._bound_prefetch(2)
            times[mode] = self._measure(mode)
        self._delivered = [0] * max(1, self.num_workers)
        self._stats.update(images=0, batches=0, seconds=0.0, reused_buffers=0)
        self._pools.clear()  # made with the measuring prefetch depth
        best = min(times, key=times.__getitem__)
        return best, "measured seconds/batch " + ", ".join(f"{m}={t:.4f}" for m, t in times.items())

    def _measure(self, mode: str, batches: int = 4) -> float:
        it = self._iterate(mode)
        next(it)  # warm-up: worker start, first decode
        torch.cuda.synchronize()
        t = time.perf_counter()
        n = 0
        for _ in range(batches):
            try:
                next(it)
            except StopIteration:
                break
            n += 1
        torch.cuda.synchronize()
        it.close()
        return (time.perf_counter() - t) / max(1, n)

    # --- the training-loop interface ---------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch (seeds shard order and shuffle); call before iterating each epoch."""
        self.dataset.set_epoch(epoch)
        self._delivered = [0] * max(1, self.num_workers)

    def __len__(self) -> int:
        """Batches this rank yields per epoch (the same on every rank)."""
        import numpy as np

        per_worker = np.array_split(np.arange(len(self.dataset)), max(1, self.num_workers))
        return sum(-(-len(p) // self.batch_size) for p in per_worker)

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        return self._iterate(self.preprocess)

    def _iterate(self, mode: str) -> Iterator[tuple[Any, Any]]:
        skips, self._skips = self._skips, None
        self._delivered = list(skips) if skips else [0] * max(1, self.num_workers)
        dl, buffers, control = self._pool(mode)
        tag = control.start(self.dataset.epoch, skips)
        if mode == "gpu":
            yield from self._device_batches(iter(dl))
            return
        start = time.perf_counter()
        reclaim = buffers is not None
        for images, labels, meta in dl:
            self._account(meta, len(labels), start)
            if buffers is not None:
                if reclaim:  # the workers have left any abandoned iteration behind
                    buffers.reclaim(tag)
                    reclaim = False
                buffers.release_unused()
                buffers.hold(meta["worker"], meta["buffer"], images)
            if self.device.type != "cpu":
                images = images.to(self.device, non_blocking=self.non_blocking)
                labels = labels.to(self.device, non_blocking=self.non_blocking)
            yield images, labels

    def _pool(self, mode: str) -> tuple[Any, SharedBatchBuffers | None, _Control]:
        """The DataLoader for `mode`, made once: its worker processes serve every epoch."""
        if mode not in self._pools:
            control = _Control(self.num_workers)
            buffers = None
            if mode == "cpu" and self.num_workers > 0:  # reuse output batches
                buffers = SharedBatchBuffers(self.num_workers, slots=self.prefetch + 1)
            stream = _BatchStream(self, "bytes" if mode == "gpu" else "cpu", control, buffers)
            dl = torch.utils.data.DataLoader(
                stream,
                batch_size=None,
                num_workers=self.num_workers,
                prefetch_factor=self.prefetch if self.num_workers > 0 else None,
                pin_memory=self.pin_memory and mode == "cpu",
                persistent_workers=self.num_workers > 0,
            )
            self._pools[mode] = (dl, buffers, control)
        return self._pools[mode]

    def _device_batches(self, raw: Iterator[Any]) -> Iterator[tuple[Any, Any]]:
        from gpufeed.data.gpu import DevicePreprocessor

        if self.device_bytes_bound() > self.max_device_bytes:
            raise ValueError(
                f"max_device_bytes={self.max_device_bytes:,} is too small for GPU preprocessing "
                f"of batches of {self.batch_size}: needs {self.device_bytes_bound():,}; "
                "raise it or lower batch_size"
            )
        pre = DevicePreprocessor(
            self.augment,
            self.device,
            dtype=self.dtype,
            channels_last=self.channels_last,
            strict=self.strict,
        )
        self._stats["decoder"] = pre.decoder_name
        start = time.perf_counter()
        pending = None
        for chunk, _, meta in raw:
            nxt = (pre.submit(chunk, meta, self.dataset), meta)
            if pending is not None:
                yield self._finish(pre, *pending, start)
            pending = nxt
        if pending is not None:
            yield self._finish(pre, *pending, start)

    def _finish(self, pre: Any, p: Any, meta: dict[str, Any], start: float) -> tuple[Any, Any]:
        meta["corrupt"] = p.corrupt
        self._account(meta, len(p.labels), start)
        return pre.finish(p)

    def _account(self, meta: dict[str, Any], n: int, start: float) -> None:
        self._delivered[meta["worker"]] = meta["first"] + meta["consumed"]
        self._corrupt += [tuple(c) for c in meta.get("corrupt", [])]  # type: ignore[misc]
        st = self._stats
        st["images"] += n
        st["batches"] += 1
        st["retried"] += meta.get("retried", 0)
        st["reused_buffers"] += meta.get("reused", False)
        st["seconds"] = time.perf_counter() - start

    # --- resumption --------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where this rank is in the epoch: samples delivered per worker (plan positions)."""
        ds = self.dataset
        return {
            "epoch": ds.epoch,
            "seed": ds.seed,
            "world_size": ds.world_size,
            "rank": ds.rank,
            "num_workers": self.num_workers,
            "batch_size": self.batch_size,
            "samples": ds.index.total,
            "delivered": list(self._delivered),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next iteration delivers exactly the samples not yet delivered this epoch."""
        mine = self.state_dict()
        for key in _STATE_KEYS:
            if key not in state:
                raise ValueError(
                    f"loader state has no {key!r}; pass what Loader.state_dict() returned"
                )
            if state[key] != mine[key]:
                raise ValueError(
                    f"loader state was saved with {key}={state[key]!r} but this loader has "
                    f"{mine[key]!r}; resume with the same {key}"
                )
        self.dataset.set_epoch(int(state["epoch"]))
        self._skips = [int(x) for x in state["delivered"]]
        self._delivered = list(self._skips)

    # --- reporting ---------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Throughput, corrupt samples (shard, key, reason), retries and memory bounds."""
        st = dict(self._stats)
        st["images_per_s"] = st["images"] / st["seconds"] if st["seconds"] else 0.0
        st["corrupt"] = len(self._corrupt)
        st["corrupt_samples"] = [
            {"shard": s, "key": k, "reason": r} for s, k, r in self._corrupt[:100]
        ]
        st["preprocess"], st["preprocess_reason"] = self.preprocess, self.preprocess_reason
        st["prefetch"] = self.prefetch
        st["host_bytes_bound"] = self.host_bytes_bound(self.prefetch)
        st["max_host_bytes"] = self.max_host_bytes
        st["device_bytes_bound"] = self.device_bytes_bound()
        if self.device.type == "cuda":
            st["device_max_allocated"] = torch.cuda.max_memory_allocated(self.device)
        return st
