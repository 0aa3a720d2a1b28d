"""The feeder threads hand the training thread its batches in order, and an error at the batch it
belongs to. The two-thread stage (decode, then resample) runs only on CUDA, so its threads are
driven here by a stage and a pool that keep the Feeder's contract and nothing else."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import pytest

from gpufeed.data.feeder import Feeder
from gpufeed.data.plan import Position


class _Plan:
    def next_position(self, at: Position) -> Position:
        return Position(at.epoch, at.batch + 1)


class _Slots:
    def index(self, worker: int, slot: int) -> int:
        return 0


@dataclass
class _Batch:
    at: Position


class _SplitStage:
    """Decode at once, resample slowly: the resample thread is still busy with batch 0 when the
    decode thread fails at batch 1."""

    split, one_thread, slots = True, False, _Slots()

    def __init__(self) -> None:
        self.seconds = {"wait_workers": 0.0, "from_slot": 0.0, "resample": 0.0}

    def from_slot(
        self, at: Position, index: int, meta: dict[str, Any], lend: Any = None
    ) -> tuple[Any, None]:
        return at, None

    def resample(self, at: Position) -> _Batch:
        time.sleep(1.2)  # longer than take's 0.5-s look at the threads
        return _Batch(at)


class _FailingPool:
    def __init__(self, fail_at: int) -> None:
        self.fail_at = fail_at

    def start(self, at: Position) -> None:
        pass

    def free(self, worker: int, slot: int) -> None:
        pass

    def get(self, at: Position, stop: threading.Event) -> tuple[int, int, dict[str, Any]]:
        if at.batch == self.fail_at:
            raise ValueError("corrupt sample in shard s-000.tar, key x: strict mode")
        return 0, 0, {}


def test_an_error_in_the_decode_thread_arrives_after_the_batch_being_resampled():
    # it read "the loader's feeder thread is not running", and batch 0 was lost
    feeder = Feeder(_FailingPool(fail_at=1), _SplitStage(), _Plan(), depth=2)  # type: ignore[arg-type]
    feeder.start(Position(0, 0))
    try:
        assert feeder.take().at == Position(0, 0)
        with pytest.raises(ValueError, match=r"corrupt sample in shard s-000\.tar"):
            feeder.take()
    finally:
        feeder.stop()
