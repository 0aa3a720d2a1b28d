"""`Loader`: a drop-in training-loop iterator over gpufeed shards: `for images, labels in loader:`.

It only wires the stages together and keeps the books; each stage is its own module:
`plan` (whole batches per rank, dealt to workers) → `workers` (processes filling shared host
`slots`, running on into the next epoch) → `feeder` (a thread) → `device` (copy + normalize, or
decode on the GPU, in a side stream) → the training loop, which only waits on a CUDA event.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import time
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from gpufeed.data import loader_state, open_loaders
from gpufeed.data.augment import Augment
from gpufeed.data.budget import default_max_host_bytes, host_bytes
from gpufeed.data.canvases import CANVAS_ELEMENTS
from gpufeed.data.choose import PREPROCESS_MODES, choose_preprocess, trial_rate
from gpufeed.data.dataset import ShardDataset
from gpufeed.data.decoders import decoder_name
from gpufeed.data.device import DeviceStage
from gpufeed.data.feeder import Feeder
from gpufeed.data.host_fit import deepest, too_small
from gpufeed.data.lending import Lender
from gpufeed.data.loader_iter import EpochIterator, LoaderSampler, checked_device
from gpufeed.data.loader_options import (  # noqa: F401 - DTYPES, default_workers: also from here
    DTYPES,
    check_augment_dtype,
    default_workers,
    open_dataset,
)
from gpufeed.data.loader_state import EpochPosition
from gpufeed.data.loader_stats import new_stats, warn_corrupt
from gpufeed.data.loader_stats import stats as loader_stats
from gpufeed.data.open_loaders import close_open_loaders as _close_open_loaders  # noqa: F401
from gpufeed.data.options import byte_count, flag, whole
from gpufeed.data.outputs import use_counts
from gpufeed.data.placement import Placement
from gpufeed.data.plan import BatchPlan, Position
from gpufeed.data.rank_check import check_rank
from gpufeed.data.ray_pool import RayPool, cluster_option, default_remote_workers, release_cluster
from gpufeed.data.slots import Slots
from gpufeed.data.spec import BatchSpec
from gpufeed.data.watchdog import timeout_option
from gpufeed.data.workers import InlinePool, WorkerPool
from gpufeed.errors import OptionError

DEVICE_DEPTH = 2  # batches the feeder keeps ready on the device
MOST_DECODE_THREADS = 64  # threads a worker's one native pass runs at most (_jpeg_region.c)


class Loader:
    """Batches of (images, labels) from gpufeed shards, decoded and augmented on CPU workers
    (`preprocess="cpu"`) or on the GPU (`"gpu"`), ready on the device before the loop asks.

    Each epoch of a rank is whole batches (`drop_last=True` drops the short last one); within an
    epoch every sample is delivered exactly once, also across `state_dict()` /
    `load_state_dict()`. Each new iteration is the next epoch unless `set_epoch(n)` chose one (an
    iteration no batch was taken from does not count); the epoch seeds the shard order, the
    shuffle and the augmentations, and workers run on into the next epoch while the loop ends this
    one. A corrupt image is left out and listed in `stats()` (`strict=True` raises); a worker that
    makes no progress for `worker_timeout` seconds is named in a `LoaderWorkerError`. Host
    buffers are shared, reused and page-locked once, within `max_host_bytes`.

    `decoder` chooses who decodes: with CPU preprocessing the workers decode each JPEG's crop
    region, most batches in one native pass ("auto"; `stats()["decoder"]` says; `decode_threads`
    threads each), or whole JPEGs ("cpu"); with `preprocess="gpu"`
    DALI, nvImageCodec, nvJPEG or libjpeg-turbo on the device stage, or the CPU workers up to the
    first warp ("workers"). `cluster=` moves the workers to a Ray cluster's CPU nodes.
    `extras=("__key__", "json")` yields `(images, labels, keys, jsons)`.

    Every option in detail, and why the loader keeps a GPU fed: docs/reference/loader.md and
    docs/getting-started/feed.md.
    """

    def __init__(
        self,
        data: str | os.PathLike[str] | ShardDataset,
        batch_size: int = 256,
        *,
        num_workers: int | None = None,
        prefetch: int = 2,
        preprocess: str = "cpu",
        decoder: str = "auto",
        decode_threads: int = 1,
        device: Any = None,
        augment: Augment | None = None,
        dtype: Any = None,
        channels_last: bool = False,
        strict: bool = False,
        drop_last: bool = False,
        max_host_bytes: int | None = None,
        max_device_bytes: int = 8 << 30,
        pin_memory: bool | None = None,
        non_blocking: bool = True,
        worker_nice: int = 5,
        worker_timeout: float | None = None,
        cluster: str | None = None,
        **dataset_options: Any,
    ) -> None:
        if preprocess not in PREPROCESS_MODES:
            raise OptionError(
                f"preprocess={preprocess!r}: choose one of {', '.join(PREPROCESS_MODES)}"
            )
        batch_size = whole("batch_size", batch_size, 1)
        prefetch = whole("prefetch", prefetch, 1)
        channels_last, strict = flag("channels_last", channels_last), flag("strict", strict)
        drop_last, non_blocking = flag("drop_last", drop_last), flag("non_blocking", non_blocking)
        if pin_memory is not None:
            pin_memory = flag("pin_memory", pin_memory)
        worker_nice = 0 if worker_nice is None else whole("worker_nice", worker_nice, -20)
        if num_workers is not None:
            num_workers = whole("num_workers", num_workers, 0)
        if max_host_bytes is not None:
            max_host_bytes = byte_count("max_host_bytes", max_host_bytes)
        self.worker_timeout = timeout_option(worker_timeout)
        check_augment_dtype(augment, dtype)
        takes = [*inspect.signature(Loader).parameters, *inspect.signature(ShardDataset).parameters]
        self.dataset = open_dataset(data, drop_last, dataset_options, takes)
        self.batch_size, self.drop_last = batch_size, drop_last
        given = isinstance(data, ShardDataset) or {"rank", "world_size"} & set(dataset_options)
        self._auto_rank = not given  # a detected split, checked against torch.distributed
        self.cluster = cluster_option(cluster, preprocess)
        if num_workers is None:
            num_workers = default_workers() if cluster is None else default_remote_workers(cluster)
        self.num_workers = num_workers
        self.decoder = decoder
        self.decode_threads = whole("decode_threads", decode_threads, 1, MOST_DECODE_THREADS)
        self.augment = augment or Augment()
        self.dtype = torch.float32 if dtype is None else dtype
        self.channels_last, self.strict = channels_last, strict
        self.device = checked_device(device)
        self.pin_memory = (self.device.type == "cuda") if pin_memory is None else pin_memory
        self.non_blocking, self.worker_nice = non_blocking, worker_nice
        self.max_host_bytes = default_max_host_bytes() if max_host_bytes is None else max_host_bytes
        self.max_device_bytes = max_device_bytes
        self.plan = BatchPlan(self.dataset, batch_size, self.num_workers, drop_last)
        self.sampler = LoaderSampler(self)
        self.batch_sampler = None  # batches made here, as DataLoader(batch_size=None): none to swap
        self._pos = EpochPosition(self.dataset.epoch)  # where it is in its epochs
        self._index_key: str | None = None  # `_index_id`, once computed
        self._feeder: Feeder | None = None
        self._pool: WorkerPool | InlinePool | RayPool | None = None
        self._slots: Slots | None = None
        self._pinned = False
        self._stage: DeviceStage | None = None
        self._lender: Lender | None = None
        self._stats = new_stats()
        self._corrupt: list[tuple[str, str, str]] = []
        self.preprocess, self.preprocess_reason = choose_preprocess(
            preprocess, self.device, self.cluster, self._trial_rate
        )
        self._room = 0  # slots per worker beyond prefetch, for batches lent to the loop
        self.prefetch = self._bound_prefetch(prefetch)
        self._stats["decoder"] = decoder_name(self.spec(), self.device)

    # --- sizing ------------------------------------------------------------------------------------

    def spec(self, preprocess: str | None = None) -> BatchSpec:
        """The batch every stage works to."""
        return BatchSpec(
            batch_size=self.batch_size,
            augment=self.augment,
            placement=self.placement(preprocess),
            dtype=self.dtype,
            channels_last=self.channels_last,
            strict=self.strict,
            max_sample_bytes=self.dataset.max_sample_bytes(),
            decoder=self.decoder,
            decode_threads=self.decode_threads,
        )

    def placement(self, preprocess: str | None = None) -> Placement:
        """Where each stage runs; workers normalize too where the device is the CPU (a cluster
        streams uint8 back, a quarter of float32's bytes, and the device stage converts)."""
        mode = preprocess or self.preprocess
        if mode == "gpu":
            return Placement.of("first_pass" if self.decoder == "workers" else "encoded")
        final = mode == "cpu" and self.device.type != "cuda" and self.cluster is None
        return Placement.of("decoded", host_final=final)

    def _slot_layout(self, prefetch: int) -> tuple[int, int]:
        """(workers, slots per worker) of the host buffers: each local worker runs `prefetch`
        batches ahead, plus its share of the batches lent to the loop; inline loading and a Ray
        cluster (whose batches wait in its object stores) take two slots in turn."""
        if self.num_workers > 0 and self.cluster is None:
            return self.num_workers, prefetch + 1 + self._room
        return 1, 2

    def _lends(self) -> bool:
        """Whether the loop gets the workers' slots themselves (`lending`): CPU batches the
        workers finish, from worker processes."""
        return self.spec().host_final and self.num_workers > 0 and use_counts()

    def host_bytes_bound(self, prefetch: int) -> int:
        """Most host memory the loader's buffers can hold with this prefetch depth."""
        return host_bytes(self.spec(), self.dataset, *self._slot_layout(prefetch))

    def _bound_prefetch(self, asked: int) -> int:
        """The deepest prefetch up to `asked` whose buffers fit `max_host_bytes`, with room for
        lent batches (those in the feeder's queue and the loop's) if that fits too; lending
        without the room still works, copying more often."""
        lent_room = -(-(DEVICE_DEPTH + 2) // self.num_workers) if self._lends() else 0
        for room in dict.fromkeys((lent_room, 0)):
            self._room = room
            prefetch = deepest(lambda p: self.host_bytes_bound(p) <= self.max_host_bytes, asked)
            if self.host_bytes_bound(prefetch) <= self.max_host_bytes:
                return prefetch
        raise too_small(self.max_host_bytes, self.spec(), self.dataset, *self._slot_layout(1))

    def device_bytes_bound(self) -> int:
        """Device memory the loader holds at most: batches ready and in the making (and, for
        GPU preprocessing, the decoded images and the resampling canvas)."""
        spec = self.spec()
        ahead = (DEVICE_DEPTH + 2) * spec.output_bytes()
        if self.preprocess != "gpu":
            return ahead
        h, w = self.augment.size
        grids = 2 * self.batch_size * h * w * 2 * 4
        if spec.handoff == "first_pass":  # the uint8 batch, two float32 ones between warps
            return ahead + self.batch_size * 3 * h * w * (1 + 2 * 4) + grids
        decoded = self.batch_size * self.dataset.max_sample_bytes() * 12  # ≈ 12× the JPEG size
        return ahead + decoded + 2 * CANVAS_ELEMENTS + grids

    def _trial_rate(self, mode: str) -> float:
        """Images/s of a short trial of this Loader's settings (all of them: a limit the user
        raised holds for the trial too) with `mode` preprocessing."""
        return trial_rate(
            Loader(
                self.dataset,
                self.batch_size,
                num_workers=self.num_workers,
                preprocess=mode,
                device=self.device,
                decoder=self.decoder,
                augment=self.augment,
                dtype=self.dtype,
                channels_last=self.channels_last,
                drop_last=self.drop_last,
                strict=self.strict,
                max_host_bytes=self.max_host_bytes,
                max_device_bytes=self.max_device_bytes,
                pin_memory=self.pin_memory,
                non_blocking=self.non_blocking,
                worker_nice=self.worker_nice,
                worker_timeout=self.worker_timeout,
            )
        )

    # --- the training-loop interface ---------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch of the next iteration (it seeds shard order, shuffle, augmentations).
        Without it each iteration is the epoch after the previous one. After `load_state_dict`,
        the same epoch keeps the restored position (trainers call both on resume)."""
        epoch = whole("set_epoch's epoch", epoch)
        if self._pos.next is None and self._pos.fresh is not None and self._feeder is not None:
            if self._pos.fresh.epoch != epoch:  # iter() came first (Lightning): aim it at `epoch`
                self._begin(Position(epoch, 0))
                live = self._pos.live()
                if live is not None and live._token == self._pos.token:
                    live._at = self._pos.fresh
            return
        if self._pos.next is None or self._pos.next.epoch != epoch:
            self._pos.next = Position(epoch, 0)

    def __len__(self) -> int:
        """Batches per epoch on this rank (the same on every rank, for any num_workers); of an
        epoch resumed on other counts, its own."""
        return self.plan.batches_in(
            self._pos.epoch if self._pos.next is None else self._pos.next.epoch
        )

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        """The epoch's batches, (images, labels) on the device; see the class docstring for
        which epoch."""
        if self._forked():
            raise RuntimeError(
                "this Loader's workers belong to the process it was forked from: make a new "
                "Loader in this process (iterating the inherited one would stop the parent's)"
            )
        if self._auto_rank:
            check_rank(self.dataset.rank, self.dataset.world_size)
        if self._pos.next is not None:
            at = self._pos.next
        elif self._pos.fresh is not None:  # nothing was taken from the last one: not an epoch
            at = self._pos.fresh
        elif self._pos.iterated:
            at = Position(self._pos.epoch + 1, 0)
        else:
            at = Position(self._pos.epoch, 0)
        self._pos.next, self._pos.iterated = None, True
        self._begin(at)
        self._pos.token += 1
        it = EpochIterator(self, at, self._pos.token)
        self._pos.live = weakref.ref(it)
        return it

    def _begin(self, at: Position) -> None:
        """Make `at` where the current iteration starts, and the feeder run from there."""
        self._pos.fresh = at if at.batch < self.plan.batches_in(at.epoch) else None
        self._pos.epoch, self._pos.delivered = at.epoch, at.batch
        self.dataset.set_epoch(at.epoch)
        feeder = self._running_feeder()
        if not feeder.running or feeder.expected != at:
            feeder.start(at)

    def _running_feeder(self) -> Feeder:
        if self._feeder is None:
            try:
                self._start_feeder()
            except BaseException:  # a setting refused after the workers started: stop them
                self.close(wait=0)
                raise
        assert self._feeder is not None
        return self._feeder

    def _start_feeder(self) -> None:
        """Make the slots, the worker pool, the device stage and the feeder thread."""
        spec = self.spec()
        self._slots = Slots(spec, *self._slot_layout(self.prefetch))
        # this process's own retries (the index read): workers and Ray actors report only theirs
        self._stats["retried"] += self.dataset.source.new_retries()
        if self.cluster is not None:
            self._pool = RayPool(
                self.plan,
                self._slots,
                self.cluster,
                depth=self.prefetch + 1,
                timeout=self.worker_timeout,
            )
        elif self.num_workers > 0:
            self._pool = WorkerPool(
                self.plan, self._slots, nice=self.worker_nice, timeout=self.worker_timeout
            )
        else:
            self._pool = InlinePool(self.plan, self._slots)
        # after the fork: CUDA may keep page-locked memory out of later forks
        if self.device.type == "cuda" and self.pin_memory and spec.handoff != "encoded":
            self._pinned = self._slots.pin() and self.non_blocking
        stage = DeviceStage(
            spec,
            self.device,
            self._slots,
            pinned=self._pinned,
            seed=self.dataset.seed,
            rank=self.dataset.rank,
        )
        if self.preprocess == "gpu" and self.device_bytes_bound() > self.max_device_bytes:
            raise OptionError(
                f"max_device_bytes={self.max_device_bytes:,} is too small for GPU "
                f"preprocessing of batches of {self.batch_size}: needs "
                f"{self.device_bytes_bound():,}; pass max_device_bytes="
                f"{self.device_bytes_bound()} or lower batch_size"
            )
        self._stage = stage
        self._stats["decoder"] = stage.decoder_name  # auto's fallback, if any
        self._lender = Lender(self._slots) if self._lends() else None
        self._feeder = Feeder(self._pool, stage, self.plan, DEVICE_DEPTH, self._lender)
        open_loaders.opened(self)

    def _take(self, token: int, at: Position, first: bool = False) -> tuple[Any, ...]:
        if token != self._pos.token:
            raise RuntimeError(
                "another iteration over this Loader has started: a Loader serves one at a time"
            )
        if self._feeder is None:
            raise RuntimeError(
                "this Loader was closed: its iterators end there (iterating it again starts "
                "its next epoch; `loader.load_state_dict(loader.state_dict())` first resumes "
                "where it stopped)"
            )
        t0 = time.perf_counter()
        batch = self._feeder.take()
        wait = time.perf_counter() - t0
        if batch.at != at:
            raise RuntimeError(f"gpufeed loader delivered batch {batch.at}, expected {at}")
        images, labels = batch.images, batch.labels
        if batch.ready is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(batch.ready)
            images.record_stream(current)
            labels.record_stream(current)
        st = self._stats
        if first:
            st["first_batch_waits"].append(wait)
        st["images"] += len(labels)
        st["batches"] += 1
        st["wait_seconds"] += wait
        st["retried"] += batch.retried
        if batch.corrupt:
            warn_corrupt(at, batch.corrupt, len(labels), first=not self._corrupt)
            self._corrupt += batch.corrupt
        self._pos.delivered, self._pos.fresh = at.batch + 1, None
        return (images, labels, *batch.extras)  # extras=: one list per name after the labels

    def close(self, wait: float = 1.0) -> None:
        """Stop the feeder thread and the worker processes (also done when the Loader is freed).
        Waits at most `wait` seconds for the feeder: one stuck in a read ends when it returns.
        A forked copy (another process) lets go of them: they are its parent's."""
        if self._forked():
            self._feeder = self._pool = self._slots = None
            return
        if getattr(self, "cluster", None) is not None:  # also after a failed __init__
            release_cluster()  # disconnect what cluster= connected, if no pool uses it
        if self._feeder is not None:
            self._feeder.stop(wait)
            open_loaders.stopped(self, self._feeder)  # still ending: waited for at exit
        if self._pool is not None:
            self._pool.close()
        if self._slots is not None:
            self._slots.unpin()
        if self._lender is not None:
            self._stats["lent_batches"] += self._lender.lent
        self._feeder = self._pool = self._slots = self._lender = None
        open_loaders.closed(self)

    def _forked(self) -> bool:
        """True in a process forked from the one whose workers this Loader runs: they share its
        pipes, and a word from here would stop them or move them on under the parent."""
        owner = open_loaders.owner(self)
        return owner is not None and owner != os.getpid()

    def __del__(self) -> None:
        # may run on any thread, even one the feeder waits for: signal, never wait
        with contextlib.suppress(Exception):
            self.close(wait=0)

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Refused, by name: a Loader is made where it is iterated, never pickled or copied."""
        raise TypeError(
            "a gpufeed Loader cannot be pickled or copied: it owns worker processes, shared "
            "memory and a feeder thread. Create it in the process that iterates it (e.g. in the "
            "function that torch.multiprocessing.spawn or a DDP-spawn trainer runs), from the "
            "same arguments; its state_dict() carries the position across"
        )

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- resumption --------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where this rank is: the epoch and how many of its batches were delivered (and, inside
        an epoch resumed on other counts, the stages of it delivered before: `resume`)."""
        return loader_state.state_dict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next iteration delivers exactly the batches not yet delivered. A state
        saved on other counts of ranks or workers (elastic restarts) delivers the rest of its
        epoch shared among this job's ranks and workers, then the usual epochs (`resume`)."""
        loader_state.load_state_dict(self, state)

    # --- reporting ---------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Throughput, data wait, first-batch wait per epoch, corrupt samples (`corrupt`: how
        many; `corrupt_samples`: the first 100, shard, key and reason), `retried` (requests sent
        again after a transient failure, each once, by whichever layer re-sent it), memory
        bounds and `lent_batches` (CPU batches handed out as their workers' slots, uncopied)."""
        return loader_stats(self)

    def _add_seconds(self, seconds: float) -> None:
        self._stats["seconds"] += seconds
