"""`Loader`: a drop-in training-loop iterator over gpufeed shards: `for images, labels in loader:`.

It only wires the stages together and keeps the books; each stage is its own module:
`plan` (whole batches per rank, dealt to workers) → `workers` (processes filling shared host
`slots`, running on into the next epoch) → `feeder` (a thread) → `device` (copy + normalize, or
decode on the GPU, in a side stream) → the training loop, which only waits on a CUDA event.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import inspect
import os
import time
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from gpufeed.cores import cores_per_rank
from gpufeed.data.augment import Augment
from gpufeed.data.budget import default_max_host_bytes, host_bytes
from gpufeed.data.choose import PREPROCESS_MODES, choose_preprocess, trial_rate
from gpufeed.data.dataset import ShardDataset
from gpufeed.data.device import CANVAS_ELEMENTS, DeviceStage, decoder_name
from gpufeed.data.feeder import Feeder
from gpufeed.data.host_fit import deepest, too_small
from gpufeed.data.lending import Lender
from gpufeed.data.options import byte_count, flag, known, whole
from gpufeed.data.outputs import use_counts
from gpufeed.data.plan import BatchPlan, Position
from gpufeed.data.rank_check import check_rank
from gpufeed.data.remote import RayPool, cluster_option, default_remote_workers, release_cluster
from gpufeed.data.resume import COUNT_KEYS, Stage, resume
from gpufeed.data.slots import Slots
from gpufeed.data.spec import BatchSpec
from gpufeed.data.watchdog import timeout_option
from gpufeed.data.workers import InlinePool, WorkerPool
from gpufeed.devices import default_device
from gpufeed.errors import OptionError
from gpufeed.text import visible

# What the loop may receive: floats normalized, or uint8 pixels (augmented, not normalized)
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.uint8)

DEVICE_DEPTH = 2  # batches the feeder keeps ready on the device
# what fixes the order a state's position counts in; not the rank: every rank has the same
# batches per epoch, and DDP trainers (Lightning) save rank 0's state and load it on every rank;
# the counts (COUNT_KEYS) may differ: the rest of the epoch is then shared anew (`resume`)
_STATE_KEYS = ("seed", "world_size", "num_workers", "batch_size", "samples", "drop_last")
# checked where saved (older states lack them); "index": which shards, in which order
_ORDER_KEYS = ("shuffle", "shuffle_buffer", "index")

try:  # the profiler measures data wait in DataLoader iterators' __next__: be one of them
    from torch.utils.data.dataloader import _BaseDataLoaderIter as _IterBase
except ImportError:  # pragma: no cover - a torch without it
    _IterBase = object  # type: ignore[assignment,misc]


# Loaders whose feeder may be running -> the pid of the process that started it
_OPEN: weakref.WeakKeyDictionary[Loader, int] = weakref.WeakKeyDictionary()
# Feeders told to stop without waiting (a Loader freed mid-run) -> the pid that started them
_STOPPING: dict[Feeder, int] = {}


def _outside_level() -> int:
    """The `stacklevel` of the first caller outside gpufeed and torch's DataLoader (the training
    loop that took the batch), for a warning that points there."""
    import sys

    inside = (
        os.path.dirname(os.path.dirname(__file__)),
        os.path.dirname(torch.utils.data.__file__),
    )
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(inside):
        frame, level = frame.f_back, level + 1
    return level


@atexit.register
def _close_open_loaders() -> None:
    """Stop the feeder threads of Loaders still open when the interpreter exits (a loop that ends
    or breaks without `close()`), and wait for those of Loaders freed meanwhile: a daemon thread
    still inside torch code when the interpreter finalizes aborts the process ("terminate called
    without an active exception", exit 134)."""
    for loader, pid in list(_OPEN.items()):
        if pid == os.getpid():  # not a forked child's copy of its parent's Loader
            with contextlib.suppress(Exception):
                loader.close(wait=5.0)
    for feeder, pid in list(_STOPPING.items()):
        if pid == os.getpid():
            with contextlib.suppress(Exception):
                feeder.stop(5.0)


def default_workers() -> int:
    """Cores per local rank (torchrun's LOCAL_WORLD_SIZE), less one for the training loop."""
    return max(1, cores_per_rank() - 1)


def _device(device: Any) -> torch.device:
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


class _Sampler:
    """`loader.sampler.set_epoch(n)`, where trainers (Lightning) look for it."""

    def __init__(self, loader: Loader) -> None:
        # weak: a strong reference back would keep a dropped Loader (and its worker processes)
        # alive until the cycle collector happens to run
        self._loader = weakref.ref(loader)

    def set_epoch(self, epoch: int) -> None:
        loader = self._loader()
        if loader is not None:
            loader.set_epoch(epoch)


class Loader:
    """Batches of (images, labels) from gpufeed shards, decoded and augmented on CPU workers
    (`preprocess="cpu"`) or on the GPU (`"gpu"`), ready on the device before the loop asks.

    Every epoch of a rank is cut into whole batches: all have `batch_size` samples but at most
    the last, which `drop_last=True` drops (with it, the few samples that do not divide evenly
    over the ranks). `len(loader)` does not depend on `num_workers`. Within an epoch every sample
    is delivered exactly once, also across `state_dict()` / `load_state_dict()`.

    Each new iteration is the next epoch (0, 1, 2, ...) unless `set_epoch(n)` chose one; an
    iteration no batch was taken from does not count (a trainer probing `iter(loader)`), and
    `set_epoch(n)` right after `iter()` still chooses that iteration's epoch. The epoch seeds
    the shard order, the shuffle and the augmentations. Workers run on into the next epoch
    while the loop finishes the current one, so the GPU does not wait at epoch boundaries. A corrupt image is left out of its batch and listed in `stats()`, with a
    warning at the first and at any batch left empty (or raises with `strict=True`). Host
    buffers are shared, reused and (on CUDA) page-locked once; they are capped by
    `max_host_bytes` (bytes, or text such as "4GB" or "512MiB"; default: a quarter of the
    machine's memory), which lowers `prefetch` to fit.

    A worker process (or Ray actor) that makes no progress while its batch is waited for
    (stopped, hung in a read, deadlocked) raises `LoaderWorkerError` naming it, its pid and
    state, and the batch, shard and key it was on, after `worker_timeout` seconds: None (the
    default) is 10× the slowest batch so far, at least 120 s; 0 waits without end. A dead worker
    raises at once.

    `cluster="HEAD_IP:6379"` (or "ray://HEAD_IP:10001", or "auto" for a cluster started on this
    machine) moves reading, decoding and augmenting to `num_workers` Ray actors on the cluster's
    CPU nodes (default: the cluster's CPUs / WORLD_SIZE); uint8 batches stream back and only the
    device stage runs here, with the same batches, resumption and corrupt-sample reports.

    With `preprocess="gpu"`, `decoder` chooses who decodes on the device stage: "dali" (NVIDIA
    DALI, `pip install "gpufeed[dali]"`; its CPU decoder when the device is the CPU),
    "nvimgcodec" (the library under DALI, on its own), "nvjpeg" (torchvision), "cpu"
    (libjpeg-turbo) or "auto" (DALI, else nvJPEG on CUDA; else libjpeg-turbo; DALI that cannot
    start on the GPU gives way to the next, with a warning). Or "workers": the CPU workers
    decode, crop and resize (with the load block's first warp, in the same resampling), and the
    device applies the rest of the load block and normalizes: for heavy augmentation
    (`Augment.load_factor(L)`, L > 1) where the CPU cores keep up with decoding but not with L
    warps per image. The same crops, flips and angles as every other path.

    With CPU preprocessing, `decoder="nvimgcodec"` has the workers decode each JPEG that they
    would decode at full size over its crop box only (nvImageCodec's CPU backend, libjpeg-turbo):
    the same pixels and batches, less CPU per image, but damage inside a JPEG's data can decode
    without a report; the other decoder names change nothing there.

    With `shuffle=False` (a `ShardDataset` option) batches arrive in the packed order, whatever
    `num_workers`: batch j holds the rank's samples j·batch_size.. (for an evaluation that
    matches outputs to files by position).

    `extras=("__key__", "json")` (WebDataset's names: "__key__", "__url__", "cls", "json", "txt")
    yields `(images, labels, keys, jsons)`: after the labels one list per name, in that order,
    aligned with the batch (corrupt samples left out of both), on every path; members decoded
    (json → object, txt → str, cls → int) unless `decode_extras=False` (bytes). A sample
    lacking a member asked for raises `sample_extras.MissingMember` naming shard, key, member.
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
        if augment is not None and not isinstance(augment, Augment):
            raise OptionError(
                f"augment={augment!r}: give a gpufeed.data.Augment (your own batch transform "
                "goes in Augment(transform=...))"
            )
        if dtype is not None and dtype not in DTYPES:
            raise OptionError(
                f"dtype={dtype!r}: give one of {', '.join(map(str, DTYPES))} (uint8: the "
                "augmented pixels, not normalized)"
            )
        if isinstance(data, ShardDataset):
            if dataset_options:
                raise OptionError(
                    f"options {sorted(dataset_options)} go to ShardDataset, which was given "
                    "ready-made"
                )
            if drop_last and not data.drop_last and data.index.total % data.world_size:
                raise OptionError(
                    "drop_last=True: the ShardDataset given ready-made pads its rank's share "
                    "with repeated samples (its drop_last is False); build it with "
                    "ShardDataset(..., drop_last=True), or give the Loader the shards' path"
                )
            self.dataset = data
        else:
            takes = [
                *inspect.signature(Loader).parameters,
                *inspect.signature(ShardDataset).parameters,
            ]
            known(
                "Loader",
                dataset_options,
                [n for n in takes if n not in ("data", "url", "dataset_options")],
            )
            self.dataset = ShardDataset(data, drop_last=drop_last, **dataset_options)
        self.batch_size, self.drop_last = batch_size, drop_last
        given = isinstance(data, ShardDataset) or {"rank", "world_size"} & set(dataset_options)
        self._auto_rank = not given  # a detected split, checked against torch.distributed
        self.cluster = cluster_option(cluster, preprocess)
        if num_workers is None:
            num_workers = default_workers() if cluster is None else default_remote_workers(cluster)
        self.num_workers = num_workers
        self.decoder = decoder
        self.augment = augment or Augment()
        self.dtype = torch.float32 if dtype is None else dtype
        self.channels_last, self.strict = channels_last, strict
        self.device = _device(device)
        self.pin_memory = (self.device.type == "cuda") if pin_memory is None else pin_memory
        self.non_blocking, self.worker_nice = non_blocking, worker_nice
        self.max_host_bytes = default_max_host_bytes() if max_host_bytes is None else max_host_bytes
        self.max_device_bytes = max_device_bytes
        self.plan = BatchPlan(self.dataset, batch_size, self.num_workers, drop_last)
        self.sampler = _Sampler(self)
        self.batch_sampler = None  # batches made here, as DataLoader(batch_size=None): none to swap
        self._epoch = self.dataset.epoch
        self._next: Position | None = None  # set by set_epoch / load_state_dict
        self._iterated = False
        self._fresh: Position | None = None  # where the iteration no batch was taken from starts
        self._live: Any = None  # weakref to that iteration
        self._delivered = 0  # batches of the current epoch handed to the loop
        self._token = 0  # the iteration in progress
        self._index_key: str | None = None  # `_index_id`, once computed
        self._feeder: Feeder | None = None
        self._pool: WorkerPool | InlinePool | RayPool | None = None
        self._slots: Slots | None = None
        self._pinned = False
        self._stage: DeviceStage | None = None
        self._lender: Lender | None = None
        self._stats: dict[str, Any] = {
            "images": 0,
            "batches": 0,
            "seconds": 0.0,
            "wait_seconds": 0.0,
            "retried": 0,
            "first_batch_waits": [],
            "lent_batches": 0,  # of lenders closed; the current one counts its own
        }
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
        mode = preprocess or self.preprocess
        handoff = "decoded"
        if mode == "gpu":
            handoff = "first_pass" if self.decoder == "workers" else "encoded"
        return BatchSpec(
            batch_size=self.batch_size,
            augment=self.augment,
            handoff=handoff,
            dtype=self.dtype,
            channels_last=self.channels_last,
            strict=self.strict,
            max_sample_bytes=self.dataset.max_sample_bytes(),
            # a cluster streams uint8 back (a quarter of float32's bytes); the device stage converts
            host_final=mode == "cpu" and self.device.type != "cuda" and self.cluster is None,
            decoder=self.decoder,
        )

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
        if self._next is None and self._fresh is not None and self._feeder is not None:
            if self._fresh.epoch != epoch:  # iter() came first (Lightning): aim it at `epoch`
                self._begin(Position(epoch, 0))
                live = self._live()
                if live is not None and live._token == self._token:
                    live._at = self._fresh
            return
        if self._next is None or self._next.epoch != epoch:
            self._next = Position(epoch, 0)

    def __len__(self) -> int:
        """Batches per epoch on this rank (the same on every rank, for any num_workers); of an
        epoch resumed on other counts, its own."""
        return self.plan.batches_in(self._epoch if self._next is None else self._next.epoch)

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
        if self._next is not None:
            at = self._next
        elif self._fresh is not None:  # nothing was taken from the last one: not an epoch
            at = self._fresh
        elif self._iterated:
            at = Position(self._epoch + 1, 0)
        else:
            at = Position(self._epoch, 0)
        self._next, self._iterated = None, True
        self._begin(at)
        self._token += 1
        it = _EpochIterator(self, at, self._token)
        self._live = weakref.ref(it)
        return it

    def _begin(self, at: Position) -> None:
        """Make `at` where the current iteration starts, and the feeder run from there."""
        self._fresh = at if at.batch < self.plan.batches_in(at.epoch) else None
        self._epoch, self._delivered = at.epoch, at.batch
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
        _OPEN[self] = os.getpid()

    def _take(self, token: int, at: Position, first: bool = False) -> tuple[Any, ...]:
        if token != self._token:
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
            self._warn_corrupt(at, batch.corrupt, len(labels))
            self._corrupt += batch.corrupt
        self._delivered, self._fresh = at.batch + 1, None
        return (images, labels, *batch.extras)  # extras=: one list per name after the labels

    def _warn_corrupt(self, at: Position, corrupt: list[tuple[str, str, str]], kept: int) -> None:
        """Say so at the first corrupt sample skipped, and at every batch left with none: the
        skip is otherwise seen only in `stats()`, and an empty batch reaches the training step."""
        shard, key, why = corrupt[0]
        where = visible(f"shard {shard}, key {key}: {why}")  # a key may hold ESC/OSC sequences
        if kept == 0:
            n = len(corrupt)
            what = "its 1 sample is corrupt" if n == 1 else f"all {n:,} of its samples are corrupt"
            warnings.warn(
                f"gpufeed Loader: batch {at.batch} of epoch {at.epoch} is empty: {what} "
                f"(the first: {where}); "
                "its loss will read NaN. Repack or remove the damaged images "
                "(loader.stats()['corrupt_samples'] lists them)",
                RuntimeWarning,
                stacklevel=_outside_level(),
            )
        elif not self._corrupt:
            warnings.warn(
                f"gpufeed Loader: left a corrupt sample out of its batch ({where}); later ones "
                "are left out without a warning and listed in loader.stats()['corrupt_samples'] "
                "(strict=True stops at the first instead)",
                RuntimeWarning,
                stacklevel=_outside_level(),
            )

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
            for feeder in [f for f in _STOPPING if not f.ending]:  # ended since
                _STOPPING.pop(feeder, None)
            if self._feeder.ending:  # still ending: waited for at exit
                _STOPPING[self._feeder] = _OPEN.get(self, os.getpid())
        if self._pool is not None:
            self._pool.close()
        if self._slots is not None:
            self._slots.unpin()
        if self._lender is not None:
            self._stats["lent_batches"] += self._lender.lent
        self._feeder = self._pool = self._slots = self._lender = None
        _OPEN.pop(self, None)

    def _forked(self) -> bool:
        """True in a process forked from the one whose workers this Loader runs: they share its
        pipes, and a word from here would stop them or move them on under the parent."""
        owner = _OPEN.get(self)
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

    _earlier: tuple[Stage, ...] = ()  # the stages of an epoch resumed on other counts before it

    def state_dict(self) -> dict[str, Any]:
        """Where this rank is: the epoch and how many of its batches were delivered (and, inside
        an epoch resumed on other counts, the stages of it delivered before: `resume`)."""
        live = self._live() if self._live is not None else None
        running = (  # an epoch part delivered: set_epoch mid-epoch applies to the next one
            live is not None
            and live._token == self._token
            and 0 < self._delivered < self.plan.batches_in(self._epoch)
        )
        if self._next is not None and not running:  # load_state_dict or set_epoch, not iterated
            epoch, batch = self._next.epoch, self._next.batch
        else:
            epoch, batch = self._epoch, self._delivered
        if batch >= self.plan.batches_in(epoch):
            epoch, batch = epoch + 1, 0
        ds = self.dataset
        state = {
            "epoch": epoch,
            "batch": batch,
            "seed": ds.seed,
            "world_size": ds.world_size,
            "rank": ds.rank,
            "num_workers": self.num_workers,
            "batch_size": self.batch_size,
            "samples": ds.index.total,
            "drop_last": self.drop_last,
            "shuffle": ds.shuffle,
            "shuffle_buffer": ds.shuffle_buffer,
            "index": self._index_id(),
        }
        if self._earlier and self.plan.remainder is not None and self.plan.remainder[0] == epoch:
            state["stages"] = [stage.as_dict() for stage in self._earlier]  # how it came to be
        return state

    def _index_id(self) -> str:
        """Which shards, with which samples, in which order: the same count of images packed
        another way (another shard size) orders an epoch differently, so a position in it means
        other samples."""
        if self._index_key is None:
            shards = [(s.name, s.samples, s.sha256) for s in self.dataset.index.shards]
            self._index_key = hashlib.sha256(repr(shards).encode()).hexdigest()[:16]
        return self._index_key

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next iteration delivers exactly the batches not yet delivered. A state
        saved on other counts of ranks or workers (elastic restarts) delivers the rest of its
        epoch shared among this job's ranks and workers, then the usual epochs (`resume`)."""
        if not isinstance(state, dict):
            raise OptionError(
                f"loader state is a {type(state).__name__}, not a dict: pass what "
                "Loader.state_dict() returned"
            )
        mine = self.state_dict()
        for key in (*_STATE_KEYS, "epoch", "batch"):
            if key not in state:
                raise OptionError(
                    f"loader state has no {key!r}; pass what Loader.state_dict() returned "
                    "(states saved by gpufeed before 0.2 cannot be resumed)"
                )
        for key in (*_STATE_KEYS, *(k for k in _ORDER_KEYS if k in state)):
            if state[key] != mine[key] and key not in COUNT_KEYS:
                raise OptionError(
                    f"loader state was saved with {key}={state[key]!r} but this loader has "
                    f"{mine[key]!r}; resume with the same {key}"
                )
        for key in ("epoch", "batch"):
            value = state[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise OptionError(
                    f"loader state {key}={value!r} is not a count (a whole number >= 0): pass "
                    "what Loader.state_dict() returned"
                )
        resumed = resume(state, self.plan, self.cluster is None)
        if resumed.plan is not self.plan:  # an epoch's remainder: its workers take the new plan
            if self._feeder is not None:
                self.close()
            self.plan = resumed.plan
        self._earlier, self._next = resumed.earlier, resumed.at

    # --- reporting ---------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Throughput, data wait, first-batch wait per epoch, corrupt samples (`corrupt`: how
        many; `corrupt_samples`: the first 100, shard, key and reason), `retried` (requests sent
        again after a transient failure, each once, by whichever layer re-sent it), memory
        bounds and `lent_batches` (CPU batches handed out as their workers' slots, uncopied)."""
        st = dict(self._stats)
        st["first_batch_waits"] = list(st["first_batch_waits"])
        st["images_per_s"] = st["images"] / st["seconds"] if st["seconds"] else 0.0
        st["corrupt"] = len(self._corrupt)
        st["corrupt_samples"] = [
            {"shard": s, "key": k, "reason": r} for s, k, r in self._corrupt[:100]
        ]
        st["preprocess"], st["preprocess_reason"] = self.preprocess, self.preprocess_reason
        st["prefetch"] = self.prefetch
        st["num_workers"] = self.num_workers
        st["cluster"] = self.cluster
        if self.cluster is not None:  # batches received from the cluster, actors lost
            pool = self._pool if isinstance(self._pool, RayPool) else None
            st["remote_bytes"] = pool.bytes_received if pool else 0
            st["remote_actors_lost"] = pool.actors_lost if pool else 0
        st["pinned"] = self._pinned
        st["lent_batches"] += self._lender.lent if self._lender is not None else 0
        st["stage_seconds"] = dict(self._stage.seconds) if self._stage is not None else {}
        st["host_bytes_bound"] = self.host_bytes_bound(self.prefetch)
        st["max_host_bytes"] = self.max_host_bytes
        st["device_bytes_bound"] = self.device_bytes_bound()
        if self.device.type == "cuda":
            st["device_max_allocated"] = torch.cuda.max_memory_allocated(self.device)
        return st

    def _add_seconds(self, seconds: float) -> None:
        self._stats["seconds"] += seconds


class _EpochIterator(_IterBase):  # type: ignore[misc,valid-type]
    """One epoch's batches. Subclasses torch's DataLoader iterator base only so that profilers
    hooking DataLoader `__next__` (gpufeed's own included) see the time spent waiting here."""

    def __init__(self, loader: Loader, at: Position, token: int) -> None:
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

    def __iter__(self) -> _EpochIterator:
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
