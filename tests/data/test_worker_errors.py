"""A worker's exception reaches the training loop as torch's DataLoader raises it: the same type
(`except ZeroDivisionError:` still works), its message naming the worker, the batch and its
samples' shards and keys, with the worker's original traceback (the user's own frames).
Real worker processes; `num_workers=0` keeps the original exception and adds a note."""

from __future__ import annotations

import re
import threading
import traceback
from pathlib import Path

import pytest

from gpufeed.data.augment import Augment
from gpufeed.data.loader import Loader
from gpufeed.data.plan import Position
from gpufeed.data.shards import ShardError
from gpufeed.data.worker_errors import LoaderWorkerError, WorkerFailure, describe_batch
from gpufeed.data.workers import LoaderWorkerError as FromWorkers


def user_transform_that_divides_by_zero(batch):
    return 1 / 0


class NeedsTwo(Exception):
    """Cannot be made from one message, but pickles (its args are what its __init__ takes)."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(code, detail)
        self.code = code


class CannotCross(Exception):
    """Neither made from one message nor unpickled (its args are not what __init__ takes)."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.lock = threading.Lock()


class Worded(Exception):
    """Its str() is not its message: one made from a message would not show it."""

    def __str__(self) -> str:
        return "always this"


def _raising(error: BaseException):
    def transform(batch):
        raise error

    return transform


def _first_error(shards: Path, num_workers: int, transform) -> BaseException:
    aug = Augment(size=(16, 16), transform=transform)
    loader = Loader(shards, 4, num_workers=num_workers, device="cpu", augment=aug)
    with loader, pytest.raises(BaseException) as raised:
        next(iter(loader))
    return raised.value


WORKER = r"Caught (\w+) in loader worker [01] \(pid \d+\) while making batch 0 of epoch 0"
SAMPLES = r"of 4 samples \(shard \S+shard-\d{5}\.tar: keys \w+"


def test_a_user_transform_error_keeps_its_type_and_brings_the_workers_traceback(shards: Path):
    error = _first_error(shards, 2, user_transform_that_divides_by_zero)
    assert type(error) is ZeroDivisionError  # `except ZeroDivisionError:` catches it
    message = str(error)
    assert re.match(WORKER, message).group(1) == "ZeroDivisionError"
    assert re.search(SAMPLES, message)
    assert "Original Traceback (most recent call last):" in message
    # the user's own frame, file and line, and the original message
    assert "in user_transform_that_divides_by_zero" in message and __file__ in message
    assert "1 / 0" in message and message.rstrip().endswith("division by zero")


def test_an_error_type_not_made_from_one_message_is_the_original_with_the_context_as_a_note(
    shards: Path,
):
    error = _first_error(shards, 2, _raising(NeedsTwo(7, "bad batch")))
    assert type(error) is NeedsTwo and error.args == (7, "bad batch") and error.code == 7
    (note,) = error.__notes__
    assert re.match(WORKER, note) and "NeedsTwo: (7, 'bad batch')" in note
    assert "in transform" in note  # the worker's traceback
    assert "Original Traceback" in "".join(traceback.format_exception(error))  # shown


def test_an_error_that_cannot_cross_is_a_loader_worker_error_with_the_traceback(shards: Path):
    error = _first_error(shards, 2, _raising(CannotCross(7, "bad batch")))
    assert type(error) is LoaderWorkerError and LoaderWorkerError is FromWorkers
    message = str(error)
    assert re.match(WORKER, message).group(1) == "CannotCross"
    assert "CannotCross: 7: bad batch" in message and "in transform" in message


def test_a_key_error_message_reads_as_text_not_as_a_repr(shards: Path):
    error = _first_error(shards, 2, _raising(KeyError("label")))
    assert type(error) is KeyError
    assert str(error).startswith("Caught KeyError in loader worker") and "\\n" not in str(error)


def test_with_num_workers_0_the_error_is_the_original_with_the_batch_as_a_note(shards: Path):
    error = _first_error(shards, 0, user_transform_that_divides_by_zero)
    assert type(error) is ZeroDivisionError and str(error) == "division by zero"
    frames = [f.name for f in traceback.extract_tb(error.__traceback__)]
    assert "user_transform_that_divides_by_zero" in frames  # the real traceback
    (note,) = error.__notes__
    assert re.match(
        r"Raised in the gpufeed loader \(num_workers=0\) while making batch 0 of epoch 0 "
        + SAMPLES,
        note,
    )


def test_rebuilding_keeps_attributes_and_respects_types_that_word_their_own_message():
    def failure(exc: BaseException) -> WorkerFailure:
        try:
            raise exc
        except BaseException as e:
            return WorkerFailure.of(e, "loader worker 3 (pid 1)", describe_batch(None, None))

    error = ValueError("gone")
    error.extra = "kept"
    rebuilt = failure(error).error()
    assert type(rebuilt) is ValueError and rebuilt.extra == "kept"
    assert str(rebuilt).startswith(
        "Caught ValueError in loader worker 3 (pid 1) while reading the samples of its next batch."
    )
    # a type whose str() is not its message: rebuilt it would lose the context, so a note
    worded = failure(Worded("x")).error()
    assert type(worded) is Worded and "Caught Worded" in worded.__notes__[0]
    # gpufeed's own errors keep their one-line message (the command line prints it): a note
    shard = failure(ShardError("shard s.tar is truncated; re-create it")).error()
    assert type(shard) is ShardError and str(shard) == "shard s.tar is truncated; re-create it"
    assert shard.__notes__[0].startswith("Caught ShardError in loader worker 3 (pid 1)")


def test_a_batch_is_described_by_its_shards_and_first_keys():
    from gpufeed.data.dataset import RawSample

    samples = [RawSample(f"s{i % 2}.tar", f"k{i}", 0, b"") for i in range(11)]
    said = describe_batch(Position(2, 5), samples)
    assert said == (
        "while making batch 5 of epoch 2 of 11 samples (shard s0.tar: keys k0, k2, k4, k6; "
        "shard s1.tar: keys k1, k3, k5, k7 and 3 more)"
    )
    assert describe_batch(Position(0, 1), samples[:1]).endswith("(shard s0.tar, key k0)")


def test_a_measured_loader_says_in_one_line_what_its_worker_raised(shards: Path):
    """`rate.measure_loader` (diagnose, tune) reads torch's "Original Traceback" wording."""
    from gpufeed.data.rate import MeasureError, measure_loader

    aug = Augment(size=(16, 16), transform=user_transform_that_divides_by_zero)
    loader = Loader(shards, 4, num_workers=2, device="cpu", augment=aug)
    with loader, pytest.raises(MeasureError) as raised:
        measure_loader(loader, seconds=1.0)
    assert str(raised.value) == (
        "the data loader raised ZeroDivisionError: division by zero (in a loader worker process)"
    )
