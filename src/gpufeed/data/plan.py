"""The batch plan: which samples form batch j of an epoch on this rank, and which worker makes it.

A rank's epoch (`ShardDataset.rank_sequence`) is cut into WHOLE batches before any worker sees
it: every batch has `batch_size` samples except at most the last one of the epoch, which
`drop_last` drops. Batches are dealt to the W workers round-robin, continuing across epochs
(batch j of epoch e goes to worker (e·B + j) mod W, B batches per epoch), so the loop takes
batches from workers in turn and no worker is behind the others when an epoch begins. Shuffled,
each worker reads one contiguous region of the rank's read order (streaming-friendly, also from
S3): the samples of its own batches of the epoch, in a seeded shuffle-buffer order. Unshuffled,
batch j is samples j·b.. of the read order (the packed order), whatever the number of workers:
each worker reads its batches' runs. Everything is a pure function of (seed, epoch, rank, W), so

- the number of batches and their sizes do not depend on the number of workers,
- resuming needs only (epoch, batches delivered), and
- a worker can run on into the next epoch before the training loop gets there.

One epoch may instead be given as an explicit list of ids (`remainder`): what is left of an epoch
resumed on other counts of ranks or workers (`resume`). It is cut and dealt the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from gpufeed.data.dataset import RawSample, ShardDataset
from gpufeed.errors import OptionError


@dataclass(frozen=True)
class Position:
    """Where a stream of batches stands: batch `batch` of epoch `epoch` is the next one."""

    epoch: int
    batch: int


class BatchPlan:
    """Batch boundaries and worker regions of every epoch of one rank."""

    def __init__(
        self,
        dataset: ShardDataset,
        batch_size: int,
        workers: int,
        drop_last: bool,
        remainder: tuple[int, np.ndarray] | None = None,
    ) -> None:
        self.dataset, self.batch_size, self.drop_last = dataset, batch_size, drop_last
        self.workers = max(1, workers)
        # (epoch, ids): that epoch is this rank's ids, in read order, instead of its usual share
        self.remainder = remainder
        self.samples = self._whole(len(dataset))
        self.batches = -(-self.samples // batch_size)
        if self.batches == 0:
            raise OptionError(
                f"batch_size={batch_size} with drop_last=True leaves no batch: this rank has only "
                f"{len(dataset)} samples per epoch; lower batch_size or pass drop_last=False"
            )

    def _whole(self, n: int) -> int:
        """Samples of an epoch of n that are delivered: whole batches only, with drop_last."""
        return (n // self.batch_size) * self.batch_size if self.drop_last else n

    def _samples_in(self, epoch: int) -> int:
        if self.remainder is not None and self.remainder[0] == epoch:
            return self._whole(len(self.remainder[1]))
        return self.samples

    def batches_in(self, epoch: int) -> int:
        """Batches of `epoch` (`batches`, but for a remainder epoch its own count)."""
        return -(-self._samples_in(epoch) // self.batch_size)

    def batch_len(self, j: int, epoch: int | None = None) -> int:
        """Samples in batch j (the last batch of the epoch may be partial)."""
        samples = self.samples if epoch is None else self._samples_in(epoch)
        return min(self.batch_size, samples - j * self.batch_size)

    def _sequence(self, epoch: int) -> np.ndarray:
        """Global ids of this rank's `epoch` in read order (the dataset is set to `epoch`)."""
        if self.remainder is not None and self.remainder[0] == epoch:
            return self.remainder[1]
        return self.dataset.rank_sequence()

    def planned(self, epoch: int) -> np.ndarray:
        """Global ids this rank delivers in `epoch`, in read order. Sets the dataset's epoch."""
        self.dataset.set_epoch(epoch)
        return self._sequence(epoch)[: self._samples_in(epoch)]

    def delivered(self, epoch: int, batches: int) -> np.ndarray:
        """Global ids of batches 0..batches-1 of `epoch`, without reading a shard: what this
        rank delivered by then. Sets the dataset's epoch."""
        self.dataset.set_epoch(epoch)
        seq, taken = self._sequence(epoch), []
        for worker in range(self.workers):
            mine = range(self._first_of(worker, epoch), min(batches, self.batches_in(epoch)))
            count = sum(self.batch_len(j, epoch) for j in mine[:: self.workers])
            if count:
                ids = self._reads(worker, epoch, seq)
                order = self.dataset.delivery_order(len(ids), worker)
                taken.append(ids[np.asarray(order[:count])])
        return np.concatenate(taken) if taken else np.zeros(0, np.int64)

    def worker_of(self, at: Position) -> int:
        """The worker that makes batch `at`."""
        return (at.epoch * self.batches + at.batch) % self.workers

    def _first_of(self, worker: int, epoch: int) -> int:
        """The first batch of `epoch` that `worker` makes."""
        return (worker - epoch * self.batches) % self.workers

    def _region(self, worker: int, epoch: int) -> tuple[int, int]:
        """(start, length) of `worker`'s region of the epoch's read order: its batches' samples."""
        start = sum(self._region_len(w, epoch) for w in range(worker))
        return start, self._region_len(worker, epoch)

    def _reads(self, worker: int, epoch: int, seq: np.ndarray | None = None) -> np.ndarray:
        """Global ids `worker` reads in `epoch`, in read order: the samples of its batches.
        Shuffled: one region of the rank's read order. Unshuffled: each batch's own run, so that
        the delivered order is the packed order (an evaluation matches outputs to files by it).
        `seq`: the epoch's sequence, where the caller has it already."""
        seq = self._sequence(epoch) if seq is None else seq
        if self.dataset.shuffle:
            offset, length = self._region(worker, epoch)
            return seq[offset : offset + length]
        b, first, end = self.batch_size, self._first_of(worker, epoch), self.batches_in(epoch)
        runs = [
            seq[j * b : j * b + self.batch_len(j, epoch)] for j in range(first, end, self.workers)
        ]
        return np.concatenate(runs) if runs else seq[:0]

    def _region_len(self, worker: int, epoch: int) -> int:
        first, end = self._first_of(worker, epoch), self.batches_in(epoch)
        return sum(self.batch_len(j, epoch) for j in range(first, end, self.workers))

    def next_position(self, at: Position) -> Position:
        """The position after `at` in an endless stream of epochs."""
        if at.batch + 1 < self.batches_in(at.epoch):
            return Position(at.epoch, at.batch + 1)
        return Position(at.epoch + 1, 0)

    def worker_batches(
        self, worker: int, start: Position
    ) -> Iterator[tuple[Position, list[RawSample]]]:
        """Endless: (position, samples) of every batch `worker` makes from `start` on, epoch after
        epoch. Reads the dataset with `set_epoch`: give each worker process its own copy."""
        ds = self.dataset
        epoch = start.epoch
        first = self._first_of(worker, epoch)
        mine_before = len(range(first, min(start.batch, self.batches_in(epoch)), self.workers))
        while True:
            ds.set_epoch(epoch)
            first, end = self._first_of(worker, epoch), self.batches_in(epoch)
            ids = self._reads(worker, epoch)
            order = ds.delivery_order(len(ids), worker)
            samples = ds.iter_planned(np.asarray(ids), order, skip=mine_before * self.batch_size)
            j = first + mine_before * self.workers
            while j < end:
                n = self.batch_len(j, epoch)
                chunk = [next(samples) for _ in range(n)]
                if j + self.workers >= end:  # its last of the epoch: files done now
                    samples.close()
                yield Position(epoch, j), chunk
                j += self.workers
            samples.close()
            epoch, mine_before = epoch + 1, 0
