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
        self, dataset: ShardDataset, batch_size: int, workers: int, drop_last: bool
    ) -> None:
        self.dataset, self.batch_size, self.drop_last = dataset, batch_size, drop_last
        self.workers = max(1, workers)
        n = len(dataset)
        self.samples = (n // batch_size) * batch_size if drop_last else n
        self.batches = -(-self.samples // batch_size)
        if self.batches == 0:
            raise OptionError(
                f"batch_size={batch_size} with drop_last=True leaves no batch: this rank has only "
                f"{n} samples per epoch; lower batch_size or pass drop_last=False"
            )

    def batch_len(self, j: int) -> int:
        """Samples in batch j (the last batch of the epoch may be partial)."""
        return min(self.batch_size, self.samples - j * self.batch_size)

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

    def _reads(self, worker: int, epoch: int) -> np.ndarray:
        """Global ids `worker` reads in `epoch`, in read order: the samples of its batches.
        Shuffled: one region of the rank's read order. Unshuffled: each batch's own run, so that
        the delivered order is the packed order (an evaluation matches outputs to files by it)."""
        seq = self.dataset.rank_sequence()
        if self.dataset.shuffle:
            offset, length = self._region(worker, epoch)
            return seq[offset : offset + length]
        b, first = self.batch_size, self._first_of(worker, epoch)
        runs = [
            seq[j * b : j * b + self.batch_len(j)] for j in range(first, self.batches, self.workers)
        ]
        return np.concatenate(runs) if runs else seq[:0]

    def _region_len(self, worker: int, epoch: int) -> int:
        first = self._first_of(worker, epoch)
        return sum(self.batch_len(j) for j in range(first, self.batches, self.workers))

    def next_position(self, at: Position) -> Position:
        """The position after `at` in an endless stream of epochs."""
        if at.batch + 1 < self.batches:
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
        mine_before = len(range(first, min(start.batch, self.batches), self.workers))
        while True:
            ds.set_epoch(epoch)
            first = self._first_of(worker, epoch)
            ids = self._reads(worker, epoch)
            order = ds.delivery_order(len(ids), worker)
            samples = ds.iter_planned(np.asarray(ids), order, skip=mine_before * self.batch_size)
            j = first + mine_before * self.workers
            while j < self.batches:
                n = self.batch_len(j)
                chunk = [next(samples) for _ in range(n)]
                if j + self.workers >= self.batches:  # its last of the epoch: files done now
                    samples.close()
                yield Position(epoch, j), chunk
                j += self.workers
            samples.close()
            epoch, mine_before = epoch + 1, 0
