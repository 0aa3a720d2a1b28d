"""`BatchMaker`: the Ray actor of `ray_pool`, run on a cluster node: it makes any plan worker's
batches, in order from a stream of its own, into uint8 arrays streamed back to the training host.

Its own module so that what runs on the cluster's nodes is apart from the pool that drives it.
"""

from __future__ import annotations

import copy
import os
import socket
import time
from dataclasses import replace
from typing import Any

import torch

from gpufeed.data.plan import BatchPlan, Position
from gpufeed.data.produce import fill_slot
from gpufeed.data.slot_meta import SlotMeta
from gpufeed.data.slots import Slots
from gpufeed.data.worker_errors import WorkerFailure, describe_batch


class BatchMaker:
    """A Ray actor that makes batches of any plan worker into uint8 arrays (runs on a node)."""

    def __init__(self, plan: BatchPlan, spec: Any) -> None:
        torch.set_num_threads(1)
        self.plan = plan
        self.slots = Slots(spec, 1, 1)
        self.streams: dict[int, tuple[int, BatchPlan, Any]] = {}  # worker -> (next g, plan, it)
        self.made = 0

    def ready(self) -> tuple[int, str]:
        """The actor's pid and host, once it has started."""
        return os.getpid(), socket.gethostname()

    def count(self) -> int:
        """Batches made so far (tests read back-pressure from it)."""
        return self.made

    def make(self, worker: int, g: int) -> tuple[Position, Any, Any, SlotMeta]:
        """Batch g of `worker`'s stream: (position, images N×H×W×3 uint8, labels, meta)."""
        started = time.monotonic()
        state = self.streams.pop(worker, None)
        if state is None or state[0] != g:
            if state is not None:
                state[2].close()
            # each stream its own dataset copy: streams set their dataset's epoch independently
            mine = copy.copy(self.plan.dataset)
            plan = BatchPlan(mine, self.plan.batch_size, self.plan.workers, self.plan.drop_last)
            b = plan.batches
            state = (g, plan, plan.worker_batches(worker, Position(g // b, g % b)))
        _, plan, stream = state
        ds = plan.dataset
        retried = ds.source.retried
        at = samples = None
        try:
            at, samples = next(stream)
            meta = fill_slot(samples, at, self.slots, 0, ds.seed, ds.rank)
        except Exception as e:  # raised in the training process, with its traceback and samples
            where = (
                f"Ray loader actor of worker {worker} (pid {os.getpid()} on {socket.gethostname()})"
            )
            raise WorkerFailure.of(e, where, describe_batch(at, samples)) from None
        # the seconds are for the pool's deadline
        meta = replace(
            meta, retried=ds.source.retried - retried, seconds=time.monotonic() - started
        )
        self.streams[worker] = (g + plan.workers, plan, stream)  # only once the batch is made
        self.made += 1
        n = meta.n
        # serialized on return, before the slot is reused
        return at, self.slots.images[0][:n].numpy(), self.slots.labels[0][:n].numpy(), meta
