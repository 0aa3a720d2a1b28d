"""`ShardDataset`: which samples this rank and worker deliver in an epoch, in which order, read from shards.

Every epoch has a plan that needs no I/O to compute:
1. the shards are put in an epoch-seeded order and their samples concatenated (the index counts);
2. that sequence is cut into equal contiguous slices per rank (sample-level, so uneven shard
   counts do not matter). When the world size does not divide the total, `drop_last=False` pads
   the last slices by wrapping around to the start of the sequence (those few samples are
   delivered twice that epoch), `drop_last=True` leaves out the remainder (a different few each
   epoch). Either way every rank gets the same number of samples, hence of batches;
3. each rank slice is cut into contiguous per-worker slices (same sizes on every rank);
4. a seeded shuffle buffer permutes each worker's slice into its delivery order.
Because the plan is a pure function of (seed, epoch, rank, worker), resuming only needs how many
samples each worker had delivered: the rest of the plan is read again, seeking past what was done.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpufeed.data.index_file import IMAGE_EXTS, Index
from gpufeed.data.members import read_with_members
from gpufeed.data.options import flag, whole
from gpufeed.data.sample_extras import extras_option, members_wanted, sample_values
from gpufeed.data.shard_urls import expand_urls, is_shard_pattern, split_shards
from gpufeed.data.shards import ShardError, iter_samples, read_indexed
from gpufeed.data.source import Source
from gpufeed.errors import OptionError
from gpufeed.text import MiB


@dataclass(frozen=True)
class RawSample:
    """One sample's undecoded bytes, with where it came from."""

    shard: str
    key: str
    label: int
    data: bytes
    extras: tuple[Any, ...] | None = None  # the values `extras=` asks for (see sample_extras)


def detect_rank() -> tuple[int, int]:
    """(rank, world_size) from an initialized torch.distributed, else RANK/WORLD_SIZE, else (0, 1)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def shuffle_buffer_order(n: int, size: int, rng: np.random.Generator) -> list[int]:
    """The output order of a classic shuffle buffer of `size` over inputs 0..n-1."""
    if size <= 1 or n <= 1:
        return list(range(n))
    picks = rng.random(n)
    buf: list[int] = []
    out: list[int] = []
    for i in range(n):
        buf.append(i)
        if len(buf) >= size:
            j = int(picks[i] * len(buf))
            buf[j], buf[-1] = buf[-1], buf[j]
            out.append(buf.pop())
    tail = rng.permutation(len(buf))
    out.extend(buf[j] for j in tail)
    return out


class ShardDataset:
    """Samples from gpufeed shards, split across ranks and workers, resumable. `url` is a data
    set directory (local or s3://) or its shards named by a brace pattern
    (`.../train-{000000..000099}.tar`); shards written by other tools are read once indexed
    with `gpufeed index`.

    Iterating yields `RawSample`s for (worker, num_workers) given to `iter_worker`; the `Loader`
    runs one such stream per worker process and decodes/augments them in batches. It is not a
    torch Dataset (its samples are encoded images): give it to `Loader`, not to a DataLoader.
    `extras=("__key__", "json", ...)` also reads each sample's key and members into
    `RawSample.extras` (decoded unless `decode_extras=False`): see `gpufeed.data.sample_extras`.
    """

    def __init__(
        self,
        url: str | os.PathLike[str],
        *,
        shuffle: bool = True,
        shuffle_buffer: int = 256,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        retries: int = 6,
        chunk_size: int = 8 * MiB,
        read_ahead: int = 2,
        extras: Sequence[str] = (),
        decode_extras: bool = True,
    ) -> None:
        if (
            isinstance(shuffle_buffer, bool)
            or not isinstance(shuffle_buffer, int)
            or shuffle_buffer < 1
        ):
            raise OptionError(
                f"shuffle_buffer={shuffle_buffer!r}: give a number of samples, 1 or more "
                "(1 keeps the shard order; pass shuffle=False to not shuffle at all)"
            )
        shuffle, drop_last = flag("shuffle", shuffle), flag("drop_last", drop_last)
        self.extras = extras_option(extras)
        self.decode_extras = flag("decode_extras", decode_extras)
        seed = whole("seed", seed)
        rank = None if rank is None else whole("rank", rank)
        world_size = None if world_size is None else whole("world_size", world_size, 1)
        retries, read_ahead = whole("retries", retries), whole("read_ahead", read_ahead)
        chunk_size = whole("chunk_size", chunk_size, 1)
        names = None
        if "*" in str(url):
            raise OptionError(
                f"{url}: a glob is not read; give the data set's folder (holding "
                "gpufeed-index.json) or its shards as a brace pattern, e.g. "
                ".../train-{000000..000099}.tar"
            )
        if is_shard_pattern(url):  # shards named one by one: their directory holds the index
            url, names = split_shards(expand_urls(url))
        self.source = Source(
            url,
            storage_options=storage_options,
            cache_dir=cache_dir,
            retries=retries,
            chunk_size=chunk_size,
            read_ahead=read_ahead,
        )
        self.index: Index = self.source.read_index()
        if names is not None:
            self.index = self.index.select(names, f"the index of {self.source.url}")
        if self.index.total == 0:
            raise ShardError(f"{self.source.url}: its index lists no samples")
        auto_rank, auto_world = detect_rank()
        self.rank = auto_rank if rank is None else rank
        self.world_size = auto_world if world_size is None else world_size
        if not 0 <= self.rank < self.world_size:
            raise OptionError(f"rank {self.rank} is outside world_size {self.world_size}")
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.shuffle_buffer = shuffle_buffer if shuffle else 1
        self.epoch = 0
        starts = np.cumsum([0] + [s.samples for s in self.index.shards])
        self._shard_start = starts
        if self.world_size > self.index.total and drop_last:
            raise OptionError(
                f"{self.index.total} samples cannot be split over {self.world_size} ranks with drop_last"
            )

    @property
    def classes(self) -> list[str]:
        """The class names, indexed by label."""
        return self.index.classes

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch: it seeds the shard order and the shuffle buffer."""
        self.epoch = whole("set_epoch's epoch", epoch)

    def __len__(self) -> int:
        """Samples this rank delivers per epoch."""
        n, w = self.index.total, self.world_size
        return n // w if self.drop_last else -(-n // w)

    def max_sample_bytes(self) -> int:
        """The largest image in the data set (bounds buffer memory); for shards whose index
        has no image sizes (a version-1 index), the largest sample."""
        sizes = []
        for s in self.index.shards:
            if len(s.image_sizes):
                sizes.append(int(np.max(s.image_sizes)))
            elif len(s.offsets):
                sizes.append(int(np.max(np.diff(np.append(s.offsets, s.bytes)))))
        return max(sizes, default=0) + 1024

    # --- the plan ---------------------------------------------------------------------------------

    def _epoch_sequence(self) -> np.ndarray:
        order = np.arange(len(self.index.shards))
        if self.shuffle:
            order = np.random.default_rng([self.seed, self.epoch]).permutation(order)
        return np.concatenate(
            [np.arange(self._shard_start[s], self._shard_start[s + 1]) for s in order]
        )

    def rank_sequence(self) -> np.ndarray:
        """Global sample ids of this rank's epoch, in read order (shard order seeded by the epoch)."""
        seq = self._epoch_sequence()
        per_rank = len(self)
        need = per_rank * self.world_size
        if need > len(seq):  # pad by repeating the epoch, as often as the ranks need
            seq = np.resize(seq, need)
        return seq[self.rank * per_rank : (self.rank + 1) * per_rank]

    def worker_slice(self, worker: int, num_workers: int) -> np.ndarray:
        """Global sample ids this (rank, worker) reads this epoch, in read order."""
        return np.array_split(self.rank_sequence(), num_workers)[worker]

    def delivery_order(self, n: int, stream: int) -> list[int]:
        """A seeded shuffle-buffer permutation of n read positions for one stream of the epoch."""
        rng = np.random.default_rng([self.seed, self.epoch, self.rank, stream, 1])
        return shuffle_buffer_order(n, self.shuffle_buffer, rng)

    def worker_plan(self, worker: int, num_workers: int) -> tuple[np.ndarray, list[int]]:
        """(read-order ids, delivery order as positions into them) for one worker this epoch."""
        ids = self.worker_slice(worker, num_workers)
        return ids, self.delivery_order(len(ids), worker)

    def locate(self, gid: int) -> tuple[int, int]:
        """(shard number, sample number inside it) of a global sample id."""
        s = int(np.searchsorted(self._shard_start, gid, side="right")) - 1
        return s, int(gid - self._shard_start[s])

    # --- reading ----------------------------------------------------------------------------------

    def iter_worker(self, worker: int, num_workers: int, skip: int = 0) -> Iterator[RawSample]:
        """Samples for (worker, num_workers) in delivery order, after the first `skip` of them."""
        ids, plan = self.worker_plan(worker, num_workers)
        return self.iter_planned(ids, plan, skip)

    def iter_planned(self, ids: np.ndarray, plan: list[int], skip: int = 0) -> Iterator[RawSample]:
        """The samples `ids[p]` for p in `plan[skip:]`, in that order, read in `ids` order with
        one seek per run of consecutive samples (holding at most a shuffle buffer's worth)."""
        todo = plan[skip:]
        needed = np.zeros(len(ids), bool)
        needed[todo] = True
        reader = self._read(ids, needed)
        held: dict[int, RawSample] = {}
        for pos in todo:
            while pos not in held:
                p, sample = next(reader)
                held[p] = sample
            yield held.pop(pos)
        reader.close()

    def _read(self, ids: np.ndarray, needed: np.ndarray) -> Iterator[tuple[int, RawSample]]:
        """(position, sample) for the needed positions, in read order, one seek per run."""
        pos = 0
        n = len(ids)
        while pos < n:
            if not needed[pos]:
                pos += 1
                continue
            shard_no, first = self.locate(int(ids[pos]))
            end = pos  # extend the run while ids stay consecutive inside one shard
            while (
                end + 1 < n
                and needed[end + 1]
                and ids[end + 1] == ids[end] + 1
                and self.locate(int(ids[end + 1]))[0] == shard_no
            ):
                end += 1
            yield from self._read_run(shard_no, first, pos, end)
            pos = end + 1

    def _read_run(
        self, shard_no: int, first: int, pos: int, end: int
    ) -> Iterator[tuple[int, RawSample]]:
        entry = self.index.shards[shard_no]
        where = self.source.path(entry.name)
        count = end - pos + 1
        last = first + count - 1
        members = members_wanted(self.extras)  # read the samples whole, not only their images
        upto = None  # the byte after the run's last image (sample): the reader reads no further
        if entry.indexed and last < entry.samples - 1:
            upto = int(entry.image_offsets[last]) + int(entry.image_sizes[last])
            if members:
                upto = int(entry.offsets[last + 1])
        start = int(entry.offsets[first])
        # a run from the first sample reads from byte 0, so the shard is hashed: bytes before its
        # first sample (a folder entry of `tar cf x.tar dir/`) are read and dropped
        head = start if first == 0 else 0
        f = self.source.open(entry, start - head, upto)
        try:
            if head and len(f.read(head)) != head:
                raise ShardError(f"shard {where} is truncated: it ends before its first sample")
            if entry.indexed:
                reader = read_with_members if members else read_indexed
                for got, (key, image, *parts) in enumerate(reader(f, entry, first, count, where)):
                    if got == count - 1:  # before the yield: a plan closes its last run at it
                        self.source.finish(f)
                    label = int(entry.labels[first + got])
                    yield pos + got, self._sample(where, key, label, image, *parts)
                return
            got = 0
            for key, parts in iter_samples(f, where, start, entry.bytes):
                i = first + got
                if key != entry.keys[i]:
                    raise ShardError(
                        f"shard {where}: sample {i} is {key!r} but the index says "
                        f"{entry.keys[i]!r}; the index does not belong to this shard"
                    )
                image = next((parts[e] for e in IMAGE_EXTS if e in parts), b"")
                if got == count - 1:
                    self.source.finish(f)
                yield pos + got, self._sample(where, key, int(entry.labels[i]), image, parts)
                got += 1
                if got == count:
                    return
            raise ShardError(
                f"shard {where} is truncated: ended after sample {first + got - 1}, "
                f"the index lists {entry.samples} samples"
            )
        finally:
            f.close()

    def _sample(
        self, shard: str, key: str, label: int, image: bytes, parts: dict[str, bytes] | None = None
    ) -> RawSample:
        """The sample, with the values `extras=` asks for (from its members `parts`), if any."""
        if not self.extras:
            return RawSample(shard, key, label, image)
        values = sample_values(self.extras, self.decode_extras, shard, key, parts or {})
        return RawSample(shard, key, label, image, values)

    def __iter__(self) -> Iterator[RawSample]:
        """All of this rank's samples for the epoch (as worker 0 of 1, or per torch worker)."""
        import torch.utils.data

        info = torch.utils.data.get_worker_info()
        worker, num = (info.id, info.num_workers) if info is not None else (0, 1)
        return self.iter_worker(worker, num)
