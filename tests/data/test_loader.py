"""Loader: a drop-in training-loop iterator over gpufeed shards.

Whole batches per rank (only the last may be partial), each iteration the next epoch, exact
resumption, uint8 hand-off from real worker processes normalized on the device stage, encoded
hand-off decoded on the feeder thread, corrupt samples, dead workers, bounded host memory.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import torch
from processes import gone, wait_until

from gpufeed.data.augment import Augment
from gpufeed.data.batch import CorruptSampleError, batch_generator, build_batch
from gpufeed.data.budget import default_max_host_bytes, machine_memory
from gpufeed.data.dali import dali_importable
from gpufeed.data.dataset import RawSample, ShardDataset
from gpufeed.data.device import nvjpeg_available
from gpufeed.data.loader import Loader
from gpufeed.data.plan import BatchPlan, Position
from gpufeed.data.workers import LoaderWorkerError
from gpufeed.errors import GpufeedError, OptionError

SMALL = Augment(size=(16, 16))
AUG = Augment.load_factor(2, size=(32, 32))
# uint8 hand-off rounds each pixel (±0.5 of 255) before normalization
UINT8_TOL = 0.5 / 255 / min(AUG.std) + 1e-4
STATE_KEYS = {
    "epoch",
    "batch",
    "seed",
    "world_size",
    "rank",
    "num_workers",
    "batch_size",
    "samples",
    "drop_last",
    "shuffle",
    "shuffle_buffer",
    "index",
}
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

MakeLoader = Callable[..., Loader]


@pytest.fixture
def make() -> Iterator[MakeLoader]:
    """`make(data, batch_size, **options)`: a Loader (tiny images by default), closed after the
    test, so no feeder thread of one test is running when the next forks its workers."""
    made: list[Loader] = []

    def new(data: Path, batch_size: int, **kw: Any) -> Loader:
        kw.setdefault("augment", SMALL)
        kw.setdefault("device", "cpu")
        loader = Loader(data, batch_size, **kw)
        made.append(loader)
        return loader

    yield new
    for loader in made:
        loader.close()


def _epoch(loader: Loader) -> list[int]:
    return [int(x) for _, labels in loader for x in labels]


def _batches(loader: Loader) -> list[tuple[torch.Tensor, list[int]]]:
    return [(images, labels.tolist()) for images, labels in loader]


def _state_after(loader: Loader, epoch: int, batches: int) -> dict[str, Any]:
    """`loader`'s state after `batches` batches of `epoch` were taken."""
    loader.set_epoch(epoch)
    for i, _ in enumerate(loader):
        if i == batches - 1:
            return loader.state_dict()
    raise AssertionError(f"epoch {epoch} has fewer than {batches} batches")


def _planned(data: Path, epoch: int, batch_size: int, workers: int, **ds: Any) -> dict:
    """Batch index -> samples of `epoch`, from a plan of our own (planning sets the epoch of
    its dataset, so never the loader's)."""
    plan = BatchPlan(ShardDataset(data, **ds), batch_size, workers, drop_last=False)
    out: dict[int, list[RawSample]] = {}
    for w in range(plan.workers):
        for at, samples in plan.worker_batches(w, Position(epoch, 0)):
            if at.epoch != epoch:
                break
            out[at.batch] = samples
    return out


def _cpu_batch(samples: list[RawSample], epoch: int, j: int, dtype: torch.dtype) -> tuple:
    """What the CPU path's `build_batch` makes of batch j of `epoch` (seed 1, rank 0, AUG)."""
    gen = batch_generator(1, epoch, 0, j)
    return build_batch(samples, AUG, gen, dtype=dtype, channels_last=False, strict=True)


# --- what the training loop gets ----------------------------------------------------------------


def test_yields_normalized_float_batches_ready_for_a_model(shards: Path, make: MakeLoader):
    loader = make(shards, 8, num_workers=0)
    images, labels = next(iter(loader))
    assert images.shape == (8, 3, 16, 16) and images.dtype == torch.float32
    assert labels.dtype == torch.long and labels.shape == (8,)
    assert -3 < images.mean().item() < 3 and images.std().item() > 0.1


@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
def test_unshuffled_batches_arrive_in_the_packed_order_whatever_the_workers(
    shards: Path, make: MakeLoader, num_workers: int
):
    packed = [s.label for s in ShardDataset(shards, shuffle=False).iter_worker(0, 1)]
    loader = make(shards, 5, num_workers=num_workers, shuffle=False)
    assert _epoch(loader) == packed
    assert _epoch(loader) == packed  # the next epoch too (workers ran on into it)


@pytest.mark.parametrize("preprocess", ["cpu", "gpu"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_uint8_channels_last_output(
    shards: Path, make: MakeLoader, preprocess: str, num_workers: int
):
    loader = make(
        shards,
        8,
        num_workers=num_workers,
        preprocess=preprocess,
        dtype=torch.uint8,
        channels_last=True,
    )
    for images, _ in loader:
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, 16, 16)
        assert images.is_contiguous(memory_format=torch.channels_last)


# --- batches per epoch --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("world", "drop_last", "sizes"),
    [
        (1, False, [5] * 9 + [3]),
        (1, True, [5] * 9),
        (2, False, [5] * 4 + [4]),
        (2, True, [5] * 4),
    ],
)
@pytest.mark.parametrize("num_workers", [0, 2, 3])
def test_whole_batches_only_the_last_partial_each_sample_once(
    shards: Path, make: MakeLoader, world: int, drop_last: bool, sizes: list[int], num_workers: int
):
    seen = []
    for rank in range(world):
        loader = make(
            shards,
            5,
            num_workers=num_workers,
            rank=rank,
            world_size=world,
            drop_last=drop_last,
        )
        loader.set_epoch(1)
        got = [labels for _, labels in _batches(loader)]
        assert [len(b) for b in got] == sizes
        assert len(loader) == len(sizes)  # the same for any num_workers and on every rank
        seen += [x for b in got for x in b]
    assert len(seen) == len(set(seen))
    if not drop_last:
        assert sorted(seen) == list(range(48))


def test_drop_last_also_drops_samples_that_do_not_divide_over_the_ranks(
    shards: Path, make: MakeLoader
):
    # 48 samples, 5 ranks: 9 per rank (3 left out), batches of 4: 2 full batches (1 dropped)
    seen = []
    for rank in range(5):
        loader = make(shards, 4, num_workers=2, rank=rank, world_size=5, drop_last=True)
        got = [labels for _, labels in _batches(loader)]
        assert [len(b) for b in got] == [4, 4] and len(loader) == 2
        seen += [x for b in got for x in b]
    assert len(seen) == len(set(seen)) == 40


@pytest.mark.parametrize("num_workers", [0, 2])
def test_more_ranks_than_twice_the_samples_still_give_every_rank_its_batch(
    shards: Path, make: MakeLoader, num_workers: int
):
    # 48 samples over 100 ranks: one each, the epoch repeated for the ranks past 48 (and past 96)
    for rank in (0, 47, 48, 97, 99):
        loader = make(shards, 4, num_workers=num_workers, rank=rank, world_size=100)
        got = [labels for _, labels in _batches(loader)]
        assert len(loader) == 1 and [len(b) for b in got] == [1]


def test_more_workers_than_batches(shards: Path, make: MakeLoader):
    loader = make(shards, 16, num_workers=4)  # 3 batches per epoch
    for _ in range(3):
        assert sorted(_epoch(loader)) == list(range(48))


# --- epochs -------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
def test_without_set_epoch_each_iteration_is_the_next_epoch(
    shards: Path, make: MakeLoader, num_workers: int
):
    loader = make(shards, 5, num_workers=num_workers, seed=3)
    first, second = _batches(loader), _batches(loader)
    assert [b for _, b in first] != [b for _, b in second]  # no replay of the same order...
    assert not torch.equal(first[0][0][:1], second[0][0][:1])  # ...or augmentations
    for epoch, got in enumerate((first, second)):
        fresh = make(shards, 5, num_workers=num_workers, seed=3)
        fresh.set_epoch(epoch)
        want = _batches(fresh)
        assert [b for _, b in got] == [b for _, b in want]
        assert all(torch.equal(x, y) for (x, _), (y, _) in zip(got, want, strict=True))


def test_set_epoch_chooses_the_epoch_and_iterations_go_on_from_it(shards: Path, make: MakeLoader):
    loader = make(shards, 5, num_workers=2, seed=3)
    loader.set_epoch(7)
    seven, eight = _epoch(loader), _epoch(loader)
    for epoch, got in ((7, seven), (8, eight)):
        fresh = make(shards, 5, num_workers=2, seed=3)
        fresh.set_epoch(epoch)
        assert _epoch(fresh) == got
    assert _epoch(make(shards, 5, num_workers=2, seed=3)) not in (seven, eight)  # epoch 0


def test_sampler_set_epoch_is_set_epoch(shards: Path, make: MakeLoader):
    """Lightning calls `loader.sampler.set_epoch(n)`."""
    a = make(shards, 5, num_workers=2, seed=3)
    a.sampler.set_epoch(5)
    b = make(shards, 5, num_workers=2, seed=3)
    b.set_epoch(5)
    got, want = _batches(a), _batches(b)
    assert [y for _, y in got] == [y for _, y in want]
    assert all(torch.equal(x, y) for (x, _), (y, _) in zip(got, want, strict=True))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_abandoned_iteration_is_fine_the_next_one_is_the_next_epoch(
    shards: Path, make: MakeLoader, num_workers: int
):
    loader = make(shards, 4, num_workers=num_workers, seed=2)
    for i, _ in enumerate(loader):
        if i == 2:
            break
    assert {k: loader.state_dict()[k] for k in ("epoch", "batch")} == {"epoch": 0, "batch": 3}
    got = _epoch(loader)
    fresh = make(shards, 4, num_workers=num_workers, seed=2)
    fresh.set_epoch(1)
    assert got == _epoch(fresh) and sorted(got) == list(range(48))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_iteration_nothing_was_taken_from_is_not_an_epoch(
    shards: Path, make: MakeLoader, num_workers: int
):
    # Lightning probes `iter(loader)` before fitting; that must not use up epoch 0
    loader = make(shards, 4, num_workers=num_workers, seed=2)
    iter(loader)
    assert {k: loader.state_dict()[k] for k in ("epoch", "batch")} == {"epoch": 0, "batch": 0}
    first, second = _epoch(loader), _epoch(loader)
    for epoch, got in ((0, first), (1, second)):
        fresh = make(shards, 4, num_workers=num_workers, seed=2)
        fresh.set_epoch(epoch)
        assert got == _epoch(fresh)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_set_epoch_right_after_iter_chooses_that_iterations_epoch(
    shards: Path, make: MakeLoader, num_workers: int
):
    # Lightning's order: iter(loader), then loader.sampler.set_epoch(epoch), then batches
    want = make(shards, 4, num_workers=num_workers, seed=2)
    want.set_epoch(3)
    whole = [y for _, y in _batches(want)]
    loader = make(shards, 4, num_workers=num_workers, seed=2)
    it = iter(loader)
    loader.sampler.set_epoch(3)
    got = [labels.tolist() for _, labels in it]
    assert got == whole
    assert {k: loader.state_dict()[k] for k in ("epoch", "batch")} == {"epoch": 4, "batch": 0}
    # ... and on resume: probe, load_state_dict, iter, set_epoch of the state's epoch
    state = _state_after(make(shards, 4, num_workers=num_workers, seed=2), 3, 5)
    resumed = make(shards, 4, num_workers=num_workers, seed=2)
    iter(resumed)
    resumed.load_state_dict(state)
    it = iter(resumed)
    resumed.sampler.set_epoch(3)
    assert [next(it)[1].tolist() for _ in range(2)] == whole[5:7]
    assert {k: resumed.state_dict()[k] for k in ("epoch", "batch")} == {"epoch": 3, "batch": 7}


def test_an_iterator_of_a_closed_loader_says_so(shards: Path, make: MakeLoader):
    loader = make(shards, 4, num_workers=2)
    it = iter(loader)
    next(it)
    loader.close()
    with pytest.raises(RuntimeError, match="this Loader was closed"):
        next(it)


def test_workers_persist_across_epochs(shards: Path, make: MakeLoader):
    loader = make(shards, 5, num_workers=2, seed=4)
    pids = []
    for _ in range(3):
        assert sorted(_epoch(loader)) == list(range(48))
        pids.append({p.pid for p in psutil.Process().children()})
    assert set(loader._pool.pids) <= pids[0]
    assert pids[0] == pids[1] == pids[2]  # the same worker processes, not new ones per epoch


# --- resumption ---------------------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 2, 3])
@pytest.mark.parametrize("k", [1, 5, 11])
def test_resume_mid_epoch_delivers_exactly_the_rest_in_order(
    shards: Path, make: MakeLoader, num_workers: int, k: int
):
    whole_loader = make(shards, 4, num_workers=num_workers, seed=3)
    whole_loader.set_epoch(2)
    whole = _batches(whole_loader)  # 12 batches

    loader = make(shards, 4, num_workers=num_workers, seed=3)
    loader.set_epoch(2)
    first = []
    for images, labels in loader:
        first.append((images, labels.tolist()))
        if len(first) == k:
            state = loader.state_dict()
            break
    assert {key: state[key] for key in ("epoch", "batch")} == {"epoch": 2, "batch": k}

    resumed = make(shards, 4, num_workers=num_workers, seed=3)
    resumed.load_state_dict(state)
    rest = _batches(resumed)
    assert [y for _, y in first + rest] == [y for _, y in whole]
    assert all(torch.equal(x, y) for (x, _), (y, _) in zip(first + rest, whole, strict=True))
    # and the iteration after the resumed one is the next epoch
    following = make(shards, 4, num_workers=num_workers, seed=3)
    following.set_epoch(3)
    assert _epoch(resumed) == _epoch(following)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_on_the_same_loader_after_its_workers_ran_ahead(
    shards: Path, make: MakeLoader, num_workers: int
):
    loader = make(shards, 4, num_workers=num_workers, seed=3)
    loader.set_epoch(2)
    whole = []
    for images, labels in loader:
        whole.append((images, labels.tolist()))
        if len(whole) == 3:
            state = loader.state_dict()
    # the epoch ran to its end: the workers (and feeder) have made epoch 3's first batches
    assert loader.state_dict()["epoch"] == 3 and loader.state_dict()["batch"] == 0
    loader.load_state_dict(state)
    rest = _batches(loader)
    assert [y for _, y in rest] == [y for _, y in whole[3:]]
    assert all(torch.equal(x, y) for (x, _), (y, _) in zip(rest, whole[3:], strict=True))
    following = make(shards, 4, num_workers=num_workers, seed=3)
    following.set_epoch(3)
    assert _epoch(loader) == _epoch(following)


@pytest.mark.parametrize("via", ["loader", "sampler"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_set_epoch_after_load_state_dict_keeps_the_restored_position(
    shards: Path, make: MakeLoader, num_workers: int, via: str
):
    """Trainers (Lightning, gpufeed.train.fit, the loop of docs/how-to/resume.md) restore the
    loader's state and then call set_epoch for the epoch they resume: that must not start it over."""
    loader = make(shards, 4, num_workers=num_workers, seed=3)
    loader.set_epoch(2)
    whole = _batches(loader)
    state = _state_after(make(shards, 4, num_workers=num_workers, seed=3), 2, 5)
    resumed = make(shards, 4, num_workers=num_workers, seed=3)
    resumed.load_state_dict(state)
    (resumed if via == "loader" else resumed.sampler).set_epoch(2)
    assert [y for _, y in _batches(resumed)] == [y for _, y in whole[5:]]
    resumed.load_state_dict(state)
    resumed.set_epoch(3)  # another epoch than the state's: that epoch, from its start
    following = make(shards, 4, num_workers=num_workers, seed=3)
    following.set_epoch(3)
    assert _epoch(resumed) == _epoch(following)


def test_state_dict_says_where_the_rank_is(shards: Path, make: MakeLoader):
    loader = make(shards, 4, num_workers=2, seed=9, rank=1, world_size=2, drop_last=True)
    assert loader.state_dict() == {
        "epoch": 0,
        "batch": 0,
        "seed": 9,
        "world_size": 2,
        "rank": 1,
        "num_workers": 2,
        "batch_size": 4,
        "samples": 48,
        "drop_last": True,
        "shuffle": True,
        "shuffle_buffer": loader.dataset.shuffle_buffer,
        "index": loader.state_dict()["index"],
    }
    assert re.fullmatch(r"[0-9a-f]{16}", loader.state_dict()["index"])
    it = iter(loader)
    next(it), next(it)
    assert (loader.state_dict()["epoch"], loader.state_dict()["batch"]) == (0, 2)
    for _ in it:
        pass
    assert (loader.state_dict()["epoch"], loader.state_dict()["batch"]) == (1, 0)
    assert set(loader.state_dict()) == STATE_KEYS


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("batch_size", 8),  # other num_workers / world_size resume: test_elastic_resume.py
        ("seed", 1),
        ("drop_last", True),
        ("shuffle", False),  # another order: samples would repeat and others be missed
        ("shuffle_buffer", 4),
    ],
)
def test_resume_with_other_settings_is_refused_naming_the_key(
    shards: Path, make: MakeLoader, option: str, value: Any
):
    options = {"num_workers": 2, "batch_size": 4, "seed": 0, "drop_last": False}
    options |= {"shuffle": True, "shuffle_buffer": 64}
    state = make(shards, **options).state_dict()
    other = make(shards, **{**options, option: value})
    saved = re.escape(f"{option}={options[option]!r}")
    with pytest.raises(ValueError, match=rf"{saved}.*resume with the same {option}"):
        other.load_state_dict(state)


def test_a_state_saved_without_the_shuffle_settings_still_resumes(shards: Path, make: MakeLoader):
    state = make(shards, 4, num_workers=0).state_dict()
    older = {k: v for k, v in state.items() if k not in ("shuffle", "shuffle_buffer")}
    loader = make(shards, 4, num_workers=0)
    loader.load_state_dict({**older, "batch": 3})
    assert loader.state_dict()["batch"] == 3


def test_rank_0s_state_resumes_every_rank_at_its_own_batches(shards: Path, make: MakeLoader):
    # DDP trainers (Lightning) save rank 0's loader state and load it on every rank
    state = _state_after(make(shards, 4, num_workers=2, rank=0, world_size=2), 1, 2)
    whole = make(shards, 4, num_workers=2, rank=1, world_size=2)
    whole.set_epoch(1)
    resumed = make(shards, 4, num_workers=2, rank=1, world_size=2)
    resumed.load_state_dict(state)
    assert [y for _, y in _batches(resumed)] == [y for _, y in _batches(whole)][2:]


def test_resume_on_another_data_set_is_refused(shards: Path, make: MakeLoader):
    state = make(shards, 4, num_workers=0, rank=0, world_size=2).state_dict()
    with pytest.raises(ValueError, match="resume with the same samples"):
        make(shards, 4, num_workers=0, rank=0, world_size=2).load_state_dict(
            {**state, "samples": 50}
        )


def test_a_state_of_the_same_images_packed_another_way_is_refused(
    shards: Path, id_list: Path, tmp_path: Path, make: MakeLoader
):
    # same 48 samples in other shards (another --shard-size): another order, so the position
    # meant other samples (duplicates and gaps), and only the count was compared
    from gpufeed.data.packing import pack

    with pytest.warns(UserWarning, match="outside 1-128 MB"):
        pack(id_list, tmp_path / "other", shard_size="40KB", workers=1, progress=False)
    state = _state_after(make(shards, 4, num_workers=0), 0, 3)
    other = make(tmp_path / "other", 4, num_workers=0)
    with pytest.raises(ValueError, match=r"saved with index='[0-9a-f]{16}'.*the same index"):
        other.load_state_dict(state)
    older = {k: v for k, v in state.items() if k != "index"}  # saved before it was recorded
    other.load_state_dict(older)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_set_epoch_mid_epoch_keeps_state_dict_where_the_loop_is(
    shards: Path, make: MakeLoader, num_workers: int
):
    # a hook calling set_epoch(current) mid-epoch made every later checkpoint of the epoch say
    # "epoch start": resuming replayed the batches already trained on
    whole = make(shards, 4, num_workers=num_workers, seed=3)
    whole.set_epoch(0)
    expected = _batches(whole)
    loader = make(shards, 4, num_workers=num_workers, seed=3)
    seen = []
    for _, labels in loader:
        seen.append(labels.tolist())
        if len(seen) == 2:
            loader.set_epoch(0)
        if len(seen) == 5:
            state = loader.state_dict()
            break
    assert (state["epoch"], state["batch"]) == (0, 5)
    resumed = make(shards, 4, num_workers=num_workers, seed=3)
    resumed.load_state_dict(state)
    assert seen + [y for _, y in _batches(resumed)] == [y for _, y in expected]


@pytest.mark.parametrize(
    ("option", "value"),
    [("drop_last", "False"), ("shuffle", "False"), ("strict", "no"), ("channels_last", 0)],
)
def test_on_off_options_given_as_text_are_refused(shards: Path, option: str, value: Any):
    # drop_last="False" (a YAML or argparse string) dropped the last batch: read as True
    with pytest.raises(OptionError, match=rf"{option} must be True or False, got {value!r}"):
        Loader(shards, 4, num_workers=0, device="cpu", **{option: value})


def test_a_forked_child_lets_go_of_the_parents_workers(shards: Path, make: MakeLoader):
    # the child's iteration moved the parent's workers on (the parent then waited forever), and
    # the child's garbage collection stopped them
    loader = make(shards, 4, num_workers=2, seed=3)
    expected = _epoch(make(shards, 4, num_workers=2, seed=3))
    it = iter(loader)
    first = [int(x) for x in next(it)[1]]
    pid = os.fork()
    if pid == 0:  # the child: iterating is refused; dropping the copy touches nothing
        code = 3
        try:
            iter(loader)
        except RuntimeError as e:
            code = 0 if "belong to the process it was forked from" in str(e) else 4
        finally:  # whatever happens, the child never goes on running the tests
            with contextlib.suppress(BaseException):
                del it
                loader.close()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert first + [int(x) for _, labels in it for x in labels] == expected


def test_a_state_from_before_whole_batches_is_refused_clearly(shards: Path, make: MakeLoader):
    old = {  # what gpufeed's Loader.state_dict() returned before (per-worker sample counts)
        "epoch": 1,
        "seed": 0,
        "world_size": 1,
        "rank": 0,
        "num_workers": 2,
        "batch_size": 4,
        "samples": 48,
        "delivered": [8, 4],
    }
    with pytest.raises(ValueError, match=r"loader state has no .*cannot be resumed"):
        make(shards, 4, num_workers=2).load_state_dict(old)


def test_a_state_outside_the_epoch_is_refused(shards: Path, make: MakeLoader):
    loader = make(shards, 4, num_workers=0)
    with pytest.raises(ValueError, match=r"batch=13 is outside 0\.\.12"):
        loader.load_state_dict({**loader.state_dict(), "batch": 13})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"batch": "3"}, r"batch='3' is not a count"),
        ({"epoch": -1}, r"epoch=-1 is not a count"),
        ({"batch": True}, r"batch=True is not a count"),
        ({"epoch": 1.5}, r"epoch=1\.5 is not a count"),
        ({"samples": "48"}, r"saved with samples='48' but this loader has 48"),
    ],
)
def test_a_state_with_wrong_values_is_a_clear_error(
    shards: Path, make: MakeLoader, change, message
):
    loader = make(shards, 4, num_workers=0)
    with pytest.raises(ValueError, match=message):
        loader.load_state_dict({**loader.state_dict(), **change})
    with pytest.raises(ValueError, match=r"loader state is a list, not a dict"):
        loader.load_state_dict([1, 2])  # type: ignore[arg-type]


def test_state_dict_right_after_load_state_dict_is_the_loaded_state(shards: Path, make: MakeLoader):
    state = {**make(shards, 4, num_workers=0).state_dict(), "epoch": 3, "batch": 5}
    loader = make(shards, 4, num_workers=0)
    loader.load_state_dict(state)
    assert loader.state_dict() == state


# --- the hand-off: uint8 from workers, normalized by the device stage ---------------------------


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_batches_are_the_cpu_path_batches_keyed_by_batch_index(
    shards: Path, make: MakeLoader, num_workers: int, channels_last: bool
):
    """Batch j is what `build_batch` makes straight to float from batch j's planned samples with
    the generator keyed by j, whichever worker made it; up to uint8 rounding where the hand-off
    is uint8 (normalized by the device stage, see test_device)."""
    loader = make(
        shards, 8, num_workers=num_workers, augment=AUG, seed=1, channels_last=channels_last
    )
    loader.set_epoch(1)
    planned = _planned(shards, 1, 8, num_workers, seed=1)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    for j, (images, labels) in enumerate(loader):
        want, want_labels, _ = _cpu_batch(planned[j], 1, j, torch.float32)
        assert torch.equal(labels, want_labels)
        assert images.dtype == torch.float32 and images.is_contiguous(memory_format=fmt)
        assert (images - want).abs().max() <= UINT8_TOL
    assert j == len(planned) - 1 == 5


def test_uint8_output_is_exactly_the_uint8_batch_of_the_cpu_path(shards: Path, make: MakeLoader):
    loader = make(shards, 8, num_workers=2, augment=AUG, seed=1, dtype=torch.uint8)
    planned = _planned(shards, 0, 8, 2, seed=1)
    for j, (images, _) in enumerate(loader):
        want, _, _ = _cpu_batch(planned[j], 0, j, torch.uint8)
        assert torch.equal(images, want)


def test_batches_the_loop_holds_are_never_overwritten_by_slot_reuse(shards: Path, make: MakeLoader):
    loader = make(shards, 2, num_workers=2, prefetch=1, seed=5, dtype=torch.uint8)
    held, copies = [], []
    for images, _ in loader:  # 24 batches through 2 × 2 slots
        held.append(images[1:])  # a view, the way a user might keep one
        copies.append(images[1:].clone())
    for _ in range(2):  # the slots go round again
        _epoch(loader)
    assert all(torch.equal(h, c) for h, c in zip(held, copies, strict=True))


def test_cpu_batches_are_the_workers_slots_lent_and_reused_once_let_go_of(
    shards: Path, make: MakeLoader
):
    loader = make(shards, 2, num_workers=2, seed=5)
    buffers = {images.data_ptr() for images, _ in loader}  # each batch dropped at the next
    # every batch of the epoch was its slot, not one copied out of it (the feeder may already
    # have lent the next epoch's first batches, which count too)
    assert loader.stats()["lent_batches"] >= 24 and loader._lender.copied == 0
    assert len(buffers) <= 10  # 2 workers × (prefetch 2 + 1 + 2 for lent batches) slots


def test_a_loop_that_keeps_every_batch_gets_copies_once_the_workers_have_no_slot_to_spare(
    shards: Path, make: MakeLoader
):
    loader = make(shards, 2, num_workers=2, prefetch=1, seed=5)
    held, copies = [], []
    for images, _ in loader:
        held.append(images)
        copies.append(images.clone())
    lent = loader.stats()["lent_batches"]
    assert 0 < lent < 24  # each worker lends all of its slots but one, then copies
    for _ in range(2):  # the slots go round again
        _epoch(loader)
    assert all(torch.equal(h, c) for h, c in zip(held, copies, strict=True))


def test_a_lent_batch_outlives_its_loader(shards: Path, make: MakeLoader):
    loader = make(shards, 2, num_workers=2, seed=5)
    images, _ = next(iter(loader))
    want = images.clone()
    assert loader.stats()["lent_batches"] >= 1
    loader.close()
    del loader
    gc.collect()
    assert torch.equal(images, want)  # its shared memory stays mapped while the batch lives


# --- preprocess="gpu": encoded hand-off, decoded on the feeder thread without CUDA ---------------


@pytest.mark.parametrize("num_workers", [0, 2])
def test_gpu_preprocess_on_cpu_gives_the_batches_of_the_cpu_path(
    shards: Path, make: MakeLoader, num_workers: int
):
    out, decoders = {}, {}
    for mode in ("cpu", "gpu"):
        loader = make(shards, 8, num_workers=num_workers, augment=AUG, preprocess=mode, seed=1)
        loader.set_epoch(2)
        out[mode] = _batches(loader)
        decoders[mode] = loader.stats()["decoder"]
        assert loader.stats()["preprocess"] == mode
    assert [y for _, y in out["cpu"]] == [y for _, y in out["gpu"]]
    for (xc, _), (xg, _) in zip(out["cpu"], out["gpu"], strict=True):
        assert xc.shape == xg.shape and xc.dtype == xg.dtype == torch.float32
        assert (xc - xg).abs().max() <= UINT8_TOL
    assert decoders["gpu"] == "libjpeg-turbo (feeder thread)"
    assert decoders["cpu"] == "libjpeg-turbo (CPU workers)"
    # the encoded path does not round: it is the float batch of build_batch
    planned = _planned(shards, 2, 8, num_workers, seed=1)
    want, _, _ = _cpu_batch(planned[3], 2, 3, torch.float32)
    torch.testing.assert_close(out["gpu"][3][0], want, atol=1e-5, rtol=0)


def test_gpu_preprocess_of_shards_indexed_without_image_sizes_keeps_every_image(
    shards: Path, make: MakeLoader, tmp_path: Path
):
    # a version-1 index has no image sizes: its encoded slots were sized for 1 KiB images, and
    # the larger ones were dropped as "unreadable image header"
    from indexes import legacy_copy

    d = legacy_copy(shards, tmp_path / "v1")
    loader = make(d, 8, num_workers=2, preprocess="gpu")
    assert sorted(_epoch(loader)) == list(range(48)) and loader.stats()["corrupt"] == 0


# --- preprocess="gpu", decoder="workers": workers decode and crop, the device warps -------------


@pytest.mark.parametrize("num_workers", [0, 2])
def test_workers_decoding_for_the_device_gives_the_batches_of_the_cpu_path(
    shards: Path, make: MakeLoader, num_workers: int
):
    """Workers hand over the first warp's uint8 result and the later warps' matrices; the device
    stage applies those: the CPU path's batch up to the one uint8 rounding after the first warp."""
    out = {}
    for mode, decoder in (("cpu", "auto"), ("gpu", "workers")):
        loader = make(
            shards,
            8,
            num_workers=num_workers,
            augment=AUG,
            preprocess=mode,
            decoder=decoder,
            seed=1,
        )
        loader.set_epoch(2)
        out[mode] = _batches(loader)
        st = loader.stats()
        assert (st["preprocess"], st["decoder"]) == (mode, "libjpeg-turbo (CPU workers)")
    assert [y for _, y in out["cpu"]] == [y for _, y in out["gpu"]]
    for (xc, _), (xg, _) in zip(out["cpu"], out["gpu"], strict=True):
        assert xc.shape == xg.shape and xg.dtype == torch.float32
        assert (xc - xg).abs().max() <= UINT8_TOL
    # the device stage did warp: the workers' first pass alone is another batch
    first_only = make(
        shards, 8, num_workers=num_workers, augment=Augment.load_factor(1, size=(32, 32)), seed=1
    )
    first_only.set_epoch(2)
    assert (out["gpu"][0][0] - _batches(first_only)[0][0]).abs().max() > 0.5


def test_the_slot_carries_one_matrix_per_warp_after_the_first(shards: Path, make: MakeLoader):
    for aug, columns in (
        (Augment.load_factor(3, size=(16, 16)), 12),
        (Augment.load_factor(3, size=(16, 16), fused=True), 0),
        (Augment.load_factor(1, size=(16, 16)), 0),
        (Augment(size=(16, 16), train=False), 0),
    ):
        spec = make(
            shards, 4, num_workers=0, preprocess="gpu", decoder="workers", augment=aug
        ).spec()
        assert (spec.handoff, spec.param_columns) == ("first_pass", columns)
        assert spec.slot_bytes == spec.image_bytes + 8 * 4 + 8 * 4 * columns


def test_with_workers_decoding_a_corrupt_image_leaves_the_others_their_warps(
    corrupt_shards: Path, make: MakeLoader
):
    aug = Augment.load_factor(2, size=(16, 16))
    got = {}
    for mode, decoder in (("cpu", "auto"), ("gpu", "workers")):
        loader = make(
            corrupt_shards, 4, num_workers=2, preprocess=mode, decoder=decoder, augment=aug
        )
        got[mode] = _batches(loader)
        assert loader.stats()["corrupt"] == 1
    bad = _bad_batch(corrupt_shards, 2)
    (xc, yc), (xg, yg) = got["cpu"][bad], got["gpu"][bad]
    assert yc == yg and len(yg) == 3
    assert (xc - xg).abs().max() <= 0.5 / 255 / min(aug.std) + 1e-4


# --- corrupt samples ----------------------------------------------------------------------------


def _bad_batch(corrupt_shards: Path, num_workers: int) -> int:
    """Index of the batch (of 4) that holds the corrupt sample (label 1) in epoch 0."""
    planned = _planned(corrupt_shards, 0, 4, num_workers)
    return next(j for j, b in planned.items() if any(s.label == 1 for s in b))


@pytest.mark.parametrize("preprocess", ["cpu", "gpu"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_corrupt_image_is_left_out_of_its_batch_and_reported_with_shard_and_key(
    corrupt_shards: Path, make: MakeLoader, preprocess: str, num_workers: int
):
    loader = make(corrupt_shards, 4, num_workers=num_workers, preprocess=preprocess)
    said = r"left a corrupt sample out of its batch \(shard \S*shard-00000\.tar, key \S*_bad: "
    with pytest.warns(RuntimeWarning, match=said) as caught:
        got = [labels for _, labels in _batches(loader)]
    (warned,) = [w for w in caught if "corrupt" in str(w.message)]  # once, not per sample
    assert warned.filename == __file__  # it points at the loop that took the batch
    bad = _bad_batch(corrupt_shards, num_workers)
    planned = _planned(corrupt_shards, 0, 4, num_workers)
    assert [len(b) for b in got] == [len(planned[j]) - (j == bad) for j in range(len(planned))]
    assert [x for b in got for x in b] == [0] * 10
    st = loader.stats()
    assert st["corrupt"] == 1
    (report,) = st["corrupt_samples"]
    assert report["shard"].endswith("shard-00000.tar") and report["key"].endswith("_bad")
    assert "decode" in report["reason"]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_batch_left_with_no_samples_is_delivered_empty_with_a_warning_naming_it(
    corrupt_shards: Path, make: MakeLoader, num_workers: int
):
    loader = make(corrupt_shards, 1, num_workers=num_workers)  # the corrupt sample is a batch
    planned = _planned(corrupt_shards, 0, 1, num_workers)
    bad = next(j for j, b in planned.items() if b[0].label == 1)
    with pytest.warns(
        RuntimeWarning, match=rf"batch {bad} of epoch 0 is empty: its 1 sample is corrupt"
    ):
        got = _batches(loader)
    assert [len(labels) for _, labels in got] == [int(j != bad) for j in range(len(planned))]
    assert got[bad][0].shape[0] == 0 and loader.stats()["corrupt"] == 1


@pytest.mark.parametrize("preprocess", ["cpu", "gpu"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_strict_raises_at_the_corrupt_batch_naming_shard_and_key(
    corrupt_shards: Path, make: MakeLoader, preprocess: str, num_workers: int
):
    loader = make(corrupt_shards, 4, num_workers=num_workers, preprocess=preprocess, strict=True)
    delivered = 0
    with pytest.raises(CorruptSampleError, match=r"shard .*shard-00000\.tar, key \S*_bad"):
        for _ in loader:
            delivered += 1
    assert delivered == _bad_batch(corrupt_shards, num_workers)
    assert loader.state_dict()["batch"] == delivered


# --- worker processes ---------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_a_killed_worker_raises_loader_worker_error_not_a_hang(shards: Path, make: MakeLoader):
    loader = make(shards, 2, num_workers=2)
    it = iter(loader)
    next(it)
    victim = loader._pool.pids[1]
    os.kill(victim, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(LoaderWorkerError, match=r"loader worker 1\b"):
        for _ in it:
            pass
    assert time.monotonic() - t0 < 60


@pytest.mark.timeout(240)
def test_a_killed_worker_is_always_named_with_its_pid(shards: Path):
    for _ in range(120):  # stops at the first message without the pid
        with Loader(shards, 2, num_workers=2, augment=SMALL, device="cpu") as loader:
            it = iter(loader)
            next(it)
            victim = loader._pool.pids[1]
            os.kill(victim, signal.SIGKILL)
            with pytest.raises(LoaderWorkerError) as raised:
                for _ in it:
                    pass
            assert f"pid {victim}" in str(raised.value), str(raised.value)
        # the error's traceback holds the loop's frames, and so the loader's shared-memory
        # slots, in a cycle: collect it, or 120 loaders hold a thousand file descriptors at once
        del raised, it
        gc.collect()


@pytest.mark.timeout(120)
def test_a_worker_killed_between_epochs_raises_loader_worker_error(shards: Path, make: MakeLoader):
    loader = make(shards, 4, num_workers=2)
    _epoch(loader)
    victim = loader._pool.processes[1]
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(timeout=30)
    loader.set_epoch(5)  # another epoch than the workers ran on into: they are restarted
    with pytest.raises(LoaderWorkerError, match=r"loader worker 1\b"):
        _epoch(loader)


def test_close_stops_the_worker_processes(shards: Path):
    loader = Loader(shards, 4, num_workers=2, augment=SMALL, device="cpu")
    next(iter(loader))
    pids = list(loader._pool.pids)
    assert len(pids) == 2 and not any(gone(pid) for pid in pids)
    loader.close()
    assert wait_until(lambda: all(gone(pid) for pid in pids))
    assert not {p.pid for p in psutil.Process().children()} & set(pids)


def test_a_loader_dropped_without_close_stops_its_workers_at_once(shards: Path):
    gc.disable()  # freed by reference counting, not whenever the cycle collector runs
    try:
        loader = Loader(shards, 4, num_workers=2, augment=SMALL, device="cpu")
        for i, _ in enumerate(loader):
            if i == 1:
                break
        pids = list(loader._pool.pids)
        del loader
        assert wait_until(lambda: all(gone(pid) for pid in pids))
    finally:
        gc.enable()


def test_an_iteration_refused_after_the_workers_started_leaves_no_workers(shards: Path):
    before = {p.pid for p in psutil.Process().children()}
    on_worker = Augment(size=(16, 16), transform=lambda x: x, transform_on="worker")
    loader = Loader(shards, 4, num_workers=2, augment=on_worker, preprocess="gpu", device="cpu")
    for _ in range(2):  # each try is refused the same way, and starts no workers of its own
        with pytest.raises(ValueError, match="transform_on"):
            iter(loader)
    loader.close()
    assert wait_until(lambda: not {p.pid for p in psutil.Process().children()} - before)


def test_a_loop_that_ends_without_close_has_its_loader_closed_at_exit(shards: Path, tmp_path: Path):
    # The usual training script: iterate, break (or finish), exit. The feeder thread still runs
    # on into the next batches; left to interpreter finalization inside torch code it aborted the
    # process ("terminate called without an active exception", exit code 134, ~1 run in 10).
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(f"""
        import atexit, threading
        from gpufeed.data.augment import Augment
        from gpufeed.data.loader import Loader
        loader = Loader({str(shards)!r}, 4, num_workers=1, augment=Augment(size=(8, 8)),
                        device="cpu")
        for i, _ in enumerate(loader):
            if i == 2:
                break
        alive = lambda: sorted(t.name for t in threading.enumerate() if t.name.startswith("gpufeed"))
        print("before exit:", alive())
        atexit._run_exitfuncs()  # what the interpreter runs first when the script ends
        print("after exit hooks:", alive(), flush=True)
        """)
    )
    cp = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr[-3000:]
    before, after = cp.stdout.splitlines()[-2:]
    assert "gpufeed-feeder" in before  # the loop left it running
    assert after == "after exit hooks: []"


def _first_read_waits(loader: Loader, wait: Callable[[], object]) -> threading.Event:
    """Make the loader's first shard read call `wait()` before it reads; the event returned is set
    once that read has begun."""
    source = loader.dataset.source
    real_open = source.open
    reading = threading.Event()

    def open_(*args: Any, **kw: Any) -> Any:
        if not reading.is_set():
            reading.set()
            wait()
        return real_open(*args, **kw)

    source.open = open_
    return reading


@pytest.mark.timeout(120)
def test_a_loader_freed_mid_read_has_its_feeder_waited_for_at_exit(shards: Path):
    # A Loader made and dropped in a function is freed at once (never waiting: it may be freed on
    # any thread); its feeder, still inside a read, must not be left to interpreter finalization.
    from gpufeed.data.loader import _close_open_loaders

    def feeders() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name == "gpufeed-feeder"}

    earlier = feeders()  # an earlier test's loader closed mid-read may still be stopping
    loader = Loader(shards, 4, num_workers=0, augment=SMALL, device="cpu")
    reading = _first_read_waits(loader, lambda: time.sleep(1.0))  # a slow connection
    iter(loader)
    assert reading.wait(30)
    gc.disable()
    try:
        del loader  # freed here, by reference counting
        assert feeders() - earlier  # still reading
        _close_open_loaders()  # what the interpreter runs when the script ends
        assert not feeders() - earlier
    finally:
        gc.enable()


def test_close_returns_promptly_while_a_read_hangs(shards: Path, make: MakeLoader):
    loader = make(shards, 4, num_workers=0)  # the feeder thread reads the shards itself
    release = threading.Event()
    reading = _first_read_waits(loader, lambda: release.wait(6))  # a stalled connection
    iter(loader)
    assert reading.wait(30)
    t0 = time.monotonic()
    try:
        loader.close()
    finally:
        release.set()
    assert time.monotonic() - t0 < 3


def test_the_iterator_is_a_dataloader_iterator_for_profilers(shards: Path, make: MakeLoader):
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    loader = make(shards, 4, num_workers=2)
    it = iter(loader)
    assert isinstance(it, _BaseDataLoaderIter)
    assert len(it) == len(loader) == 12
    next(it)
    assert sorted(p.pid for p in it._workers) == sorted(loader._pool.pids)
    assert all(isinstance(p.pid, int) for p in it._workers) and len(it._workers) == 2
    assert iter(make(shards, 4, num_workers=0))._workers == []


def test_one_iteration_at_a_time(shards: Path, make: MakeLoader):
    loader = make(shards, 4, num_workers=2)
    old = iter(loader)
    next(old)
    new = iter(loader)
    next(new)
    with pytest.raises(RuntimeError, match="another iteration over this Loader has started"):
        next(old)


# --- host memory --------------------------------------------------------------------------------


def test_host_memory_cap_defaults_to_a_quarter_of_the_machine(shards: Path, make: MakeLoader):
    loader = make(shards, 8, num_workers=2)
    assert loader.max_host_bytes == default_max_host_bytes() == machine_memory() // 4
    st = loader.stats()
    assert st["max_host_bytes"] == machine_memory() // 4
    assert 0 < st["host_bytes_bound"] <= st["max_host_bytes"]


def test_a_cap_too_small_is_refused_saying_what_would_do(shards: Path, make: MakeLoader):
    with pytest.raises(ValueError, match=r"max_host_bytes=1,000 is too small") as raised:
        make(shards, 8, num_workers=2, max_host_bytes=1000)
    need = int(re.search(r"pass max_host_bytes=(\d+)", str(raised.value)).group(1))  # type: ignore[union-attr]
    enough = make(shards, 8, num_workers=2, max_host_bytes=need)
    assert enough.prefetch == 1
    assert sorted(_epoch(enough)) == list(range(48))


def test_prefetch_is_lowered_to_fit_the_cap(shards: Path, make: MakeLoader):
    probe = make(shards, 8, num_workers=2, prefetch=4)
    assert probe.prefetch == 4
    cap = probe.host_bytes_bound(1)  # room for prefetch 1 only
    capped = make(shards, 8, num_workers=2, prefetch=4, max_host_bytes=cap)
    assert capped.prefetch == 1 and capped.stats()["host_bytes_bound"] <= cap
    assert sorted(_epoch(capped)) == list(range(48))


# --- stats --------------------------------------------------------------------------------------


def test_stats_report_throughput_waits_and_settings(shards: Path, make: MakeLoader):
    loader = make(shards, 5, num_workers=2)
    _epoch(loader)
    _epoch(loader)
    for i, _ in enumerate(loader):  # a third epoch, abandoned
        if i == 1:
            break
    st = loader.stats()
    assert st.keys() >= {
        "images",
        "batches",
        "seconds",
        "wait_seconds",
        "first_batch_waits",
        "retried",
        "corrupt",
        "corrupt_samples",
        "preprocess",
        "preprocess_reason",
        "prefetch",
        "num_workers",
        "pinned",
        "host_bytes_bound",
        "max_host_bytes",
        "device_bytes_bound",
        "decoder",
    }
    assert st["images"] == 2 * 48 + 10 and st["batches"] == 2 * 10 + 2
    assert len(st["first_batch_waits"]) == 3  # one per epoch started
    assert 0 <= st["wait_seconds"] <= st["seconds"]
    assert st["retried"] == 0 and st["corrupt"] == 0 and st["corrupt_samples"] == []
    assert (st["preprocess"], st["preprocess_reason"]) == ("cpu", "requested")
    assert (st["num_workers"], st["prefetch"], st["pinned"]) == (2, 2, False)
    assert st["device_bytes_bound"] > 0
    assert st["decoder"] == "libjpeg-turbo (CPU workers)"


def test_a_resumed_iteration_also_records_its_first_batch_wait(shards: Path, make: MakeLoader):
    loader = make(shards, 4, num_workers=2)
    for i, _ in enumerate(loader):
        if i == 2:
            state = loader.state_dict()
    loader.load_state_dict(state)  # the workers restart at batch 3: a real first-batch stall
    _epoch(loader)
    assert len(loader.stats()["first_batch_waits"]) == 2


def test_stats_have_the_same_keys_before_the_first_batch(shards: Path, make: MakeLoader):
    loader = make(shards, 5, num_workers=0)
    before = set(loader.stats())
    _epoch(loader)
    assert before == set(loader.stats())


# --- choosing the preprocessing -----------------------------------------------------------------


def test_auto_picks_cpu_without_a_gpu(shards: Path, make: MakeLoader):
    if torch.cuda.is_available():
        pytest.skip("CPU-only behaviour")
    loader = make(shards, 8, num_workers=0, preprocess="auto", device=None)
    assert loader.preprocess == "cpu" and "no CUDA" in loader.stats()["preprocess_reason"]


def test_unknown_preprocess_mode_is_refused(shards: Path):
    with pytest.raises(ValueError, match="preprocess='tpu': choose one of cpu, gpu, auto"):
        Loader(shards, preprocess="tpu")


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("batch_size", "8"),
        ("batch_size", 0),
        ("num_workers", -1),
        ("num_workers", 2.5),
        ("prefetch", 0),
    ],
)
def test_a_bad_count_is_refused_naming_the_option(shards: Path, option: str, value: object):
    with pytest.raises(OptionError, match=rf"{option} must be an integer >= \d, got {value!r}"):
        Loader(shards, **{"batch_size": 4, option: value})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"seed": -1}, "seed must be an integer >= 0, got -1"),
        ({"seed": 1.5}, "seed must be an integer >= 0, got 1.5"),
        ({"world_size": "2"}, "world_size must be an integer >= 1, got '2'"),
        ({"retries": -1}, "retries must be an integer >= 0, got -1"),
        ({"chunk_size": 0}, "chunk_size must be an integer >= 1, got 0"),
        ({"worker_nice": "x"}, "worker_nice must be an integer >= -20, got 'x'"),
        ({"dtype": torch.int32}, "dtype=torch.int32: give one of torch.float32,"),
        ({"dtype": "float16"}, "dtype='float16': give one of torch.float32,"),
        ({"decoder": "bogus"}, "decoder='bogus': choose one of auto, dali,"),
        ({"augment": "yes"}, "augment='yes': give a gpufeed.data.Augment"),
        ({"pin_memry": True}, "Loader has no option 'pin_memry': did you mean 'pin_memory'?"),
        ({"persistent_workers": True}, "Loader has no option 'persistent_workers'"),
    ],
)
def test_an_option_that_cannot_work_is_refused_when_the_loader_is_made(
    shards: Path, options: dict, message: str
):
    # each used to pass, then fail at the first batch or deep inside with a torch/numpy error
    with pytest.raises(OptionError, match=re.escape(message)):
        Loader(shards, 4, num_workers=0, device="cpu", **options)


def test_whole_numbers_in_other_forms_are_taken_and_kept_as_ints(shards: Path):
    loader = Loader(
        shards, np.int64(4), num_workers=np.int64(0), device="cpu", worker_nice=None, seed=2.0
    )
    loader.set_epoch(torch.tensor(1))
    next(iter(loader))
    state = loader.state_dict()
    assert json.loads(json.dumps(state)) == state  # plain ints: a checkpoint can hold it
    assert type(loader.batch_size) is int and loader.dataset.seed == 2 and state["epoch"] == 1


def test_set_epoch_takes_a_whole_epoch_number(shards: Path):
    loader = Loader(shards, 4, num_workers=0, device="cpu")
    for bad in (-1, 1.5, "2"):
        with pytest.raises(
            OptionError, match=rf"set_epoch's epoch must be an integer >= 0, got {bad!r}"
        ):
            loader.set_epoch(bad)
    loader.set_epoch(np.int64(3))  # a numpy integer is a whole number
    assert next(iter(loader))[0].shape[0] == 4 and loader.state_dict()["epoch"] == 3


def test_drop_last_with_a_ready_made_dataset_that_pads_its_ranks_is_refused(shards: Path):
    # the padded share would be delivered with its repeated samples
    total = len(ShardDataset(shards, world_size=1))
    uneven = next(w for w in range(2, total) if total % w)
    even = next(w for w in range(2, total) if total % w == 0)
    padded = ShardDataset(shards, rank=0, world_size=uneven)
    with pytest.raises(OptionError, match=r"ShardDataset\(\.\.\., drop_last=True\)"):
        Loader(padded, 4, num_workers=0, device="cpu", drop_last=True)
    dropped = ShardDataset(shards, rank=0, world_size=uneven, drop_last=True)
    assert len(Loader(dropped, 4, num_workers=0, device="cpu", drop_last=True)) > 0
    divided = ShardDataset(shards, rank=0, world_size=even)  # nothing to pad: taken as it is
    assert len(Loader(divided, 4, num_workers=0, device="cpu", drop_last=True)) > 0


def test_a_batch_larger_than_the_epoch_with_drop_last_is_a_gpufeed_error(shards: Path):
    with pytest.raises(GpufeedError, match="batch_size"):
        Loader(shards, 1000, drop_last=True, device="cpu")


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("tpu", "device='tpu': not a device PyTorch knows; pass 'cuda', 'cuda:N' or 'cpu'"),
        ("cuda", "device='cuda': PyTorch sees no CUDA GPU on this machine; pass device='cpu'"),
    ],
)
def test_a_device_this_machine_lacks_is_refused_when_the_loader_is_made(
    shards: Path, device: str, message: str
):
    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    with pytest.raises(OptionError, match=re.escape(message)):
        Loader(shards, 4, device=device)


def test_a_loader_refuses_to_be_pickled_or_copied_saying_to_make_it_where_it_runs(
    shards: Path, make: MakeLoader
):
    import copy
    import pickle

    loader = make(shards, 8, num_workers=1)
    for how in (pickle.dumps, copy.deepcopy, copy.copy):
        with pytest.raises(
            TypeError, match=r"cannot be pickled or copied.*Create it in the process"
        ):
            how(loader)
    assert sum(len(y) for _, y in loader) == 48  # still whole after the attempts


# --- CUDA ---------------------------------------------------------------------------------------


@gpu
@needs_cuda
def test_cuda_batches_match_the_cpu_batches(shards: Path, make: MakeLoader):
    out = {}
    for device in ("cpu", "cuda"):
        loader = make(shards, 8, num_workers=2, augment=AUG, device=device, channels_last=True)
        out[device] = _batches(loader)
        assert loader.stats()["pinned"] == (device == "cuda")
    for (xc, yc), (xg, yg) in zip(out["cpu"], out["cuda"], strict=True):
        assert xg.is_cuda and xg.is_contiguous(memory_format=torch.channels_last)
        assert yc == yg
        assert (xg.cpu() - xc).abs().max() <= UINT8_TOL  # uint8 hand-off to CUDA rounds


@gpu
@needs_cuda
def test_gpu_preprocess_on_cuda_delivers_device_batches(shards: Path, make: MakeLoader):
    loader = make(shards, 8, num_workers=2, augment=AUG, preprocess="gpu", device="cuda", seed=1)
    batches = []
    for images, labels in loader:
        assert images.is_cuda and labels.is_cuda
        batches.append((images, labels))
    assert sorted(torch.cat([y for _, y in batches]).tolist()) == list(range(48))
    st = loader.stats()
    assert st["device_max_allocated"] > 0
    nvjpeg = "nvjpeg (torchvision)" if nvjpeg_available() else "libjpeg-turbo (feeder thread)"
    assert st["decoder"] == ("dali (mixed)" if dali_importable() else nvjpeg)  # decoder="auto"
    cpu = make(shards, 8, num_workers=2, augment=AUG, preprocess="cpu", device="cpu", seed=1)
    xc = torch.cat([x for x, _ in cpu])
    xg = torch.cat([x for x, _ in batches]).cpu()
    # other decoder and resampling: the same crops and flips, so close statistics
    torch.testing.assert_close(xg.mean((0, 2, 3)), xc.mean((0, 2, 3)), atol=0.05, rtol=0)
    torch.testing.assert_close(xg.std((0, 2, 3)), xc.std((0, 2, 3)), atol=0.05, rtol=0)


@gpu
@needs_cuda
@pytest.mark.parametrize(
    ("decoder", "name"),
    [
        ("nvjpeg", "nvjpeg (torchvision)"),
        ("nvimgcodec", "nvimgcodec (cuda)"),
        ("dali", "dali (mixed)"),
        ("cpu", "libjpeg-turbo (feeder thread)"),
    ],
)
def test_each_device_decoder_on_cuda_gives_the_images_of_the_cpu_path(
    decoder: str, name: str, shards: Path, make: MakeLoader
):
    if decoder in ("nvimgcodec", "dali"):
        pytest.importorskip(f"nvidia.{decoder}")
    if decoder == "nvjpeg" and not nvjpeg_available():
        pytest.skip("needs torchvision's nvJPEG")
    kw: dict[str, Any] = {"num_workers": 2, "augment": AUG, "seed": 1}
    loader = make(shards, 8, preprocess="gpu", device="cuda", decoder=decoder, **kw)
    batches = [(x.cpu(), y.cpu()) for x, y in loader]  # 6 batches: decode buffers reused
    assert loader.stats()["decoder"] == name
    assert sorted(torch.cat([y for _, y in batches]).tolist()) == list(range(48))
    cpu = make(shards, 8, preprocess="cpu", device="cpu", **kw)
    xc = torch.cat([x for x, _ in cpu])
    xg = torch.cat([x for x, _ in batches])
    # another decoder and resampling: the same crops and flips, so close statistics
    torch.testing.assert_close(xg.mean((0, 2, 3)), xc.mean((0, 2, 3)), atol=0.05, rtol=0)
    torch.testing.assert_close(xg.std((0, 2, 3)), xc.std((0, 2, 3)), atol=0.05, rtol=0)


@gpu
@needs_cuda
def test_workers_decoding_for_cuda_matches_the_cpu_batches(shards: Path, make: MakeLoader):
    out = {}
    for device, mode in (("cpu", "cpu"), ("cuda", "gpu")):
        loader = make(
            shards, 8, num_workers=2, augment=AUG, device=device, preprocess=mode,
            decoder="workers", channels_last=True, seed=1,
        )  # fmt: skip
        out[device] = _batches(loader)
        assert loader.stats()["pinned"] == (device == "cuda")
    for (xc, yc), (xg, yg) in zip(out["cpu"], out["cuda"], strict=True):
        assert xg.is_cuda and xg.is_contiguous(memory_format=torch.channels_last) and yc == yg
        assert (xg.cpu() - xc).abs().max() <= UINT8_TOL + 1e-3  # GPU bilinear: float rounding


# --- torchrun -----------------------------------------------------------------------------------


def test_torchrun_ranks_split_the_data_exactly_once(shards: Path, tmp_path: Path):
    """Two real torchrun processes (gloo): rank auto-detected from torch.distributed; two
    epochs without set_epoch, each exactly once across the ranks, in a new order."""
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(f"""
        import torch.distributed as dist
        from gpufeed.data.augment import Augment
        from gpufeed.data.loader import Loader
        dist.init_process_group("gloo")
        loader = Loader({str(shards)!r}, 6, num_workers=1, augment=Augment(size=(8, 8)),
                        device="cpu")
        epochs = [[int(x) for _, y in loader for x in y] for _ in range(2)]
        state = loader.state_dict()
        open({str(tmp_path)!r} + f"/rank{{dist.get_rank()}}.txt", "w").write(
            f"{{len(loader)}} {{state['rank']}} {{state['epoch']}}\\n"
            + "\\n".join(" ".join(map(str, e)) for e in epochs))
        loader.close()
        dist.destroy_process_group()
        """)
    )
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(port), str(script)]  # fmt: skip
    cp = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert cp.returncode == 0, cp.stderr[-3000:]
    heads, epochs = [], []
    for r in range(2):
        head, *lines = (tmp_path / f"rank{r}.txt").read_text().splitlines()
        heads.append(head.split())
        epochs.append([[int(x) for x in line.split()] for line in lines])
    assert heads == [["4", "0", "2"], ["4", "1", "2"]]  # 4 batches each; rank; next epoch 2
    for e in range(2):
        assert sorted(epochs[0][e] + epochs[1][e]) == list(range(48))
    assert epochs[0][0] != epochs[0][1]


# --- the user's own batched transform -------------------------------------------------------------


class Invert(torch.nn.Module):
    """A batched transform as torchvision.transforms.v2 or kornia write them: uint8 in, uint8 out."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.dtype == torch.uint8 and x.dim() == 4 and x.shape[1] == 3
        return 255 - x


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_worker_transform_runs_on_the_uint8_batch_before_normalization(
    shards: Path, make: MakeLoader, num_workers: int
):
    def epoch(**kw: Any) -> list[torch.Tensor]:
        return [x for x, _ in make(shards, 8, num_workers=num_workers, shuffle=False, **kw)]

    inverted = Augment(size=(16, 16), transform=Invert())
    plain = epoch(dtype=torch.uint8)
    got = epoch(dtype=torch.uint8, augment=inverted)
    assert all(torch.equal(g, 255 - p) for g, p in zip(got, plain, strict=True))
    mean = torch.tensor(SMALL.mean).view(1, 3, 1, 1)
    std = torch.tensor(SMALL.std).view(1, 3, 1, 1)
    normalized = epoch(augment=inverted)  # float batches: normalized after the transform
    for f, p in zip(normalized, plain, strict=True):
        assert torch.allclose(f, ((255 - p).float() / 255 - mean) / std, atol=1e-5)


def test_a_device_transform_runs_on_the_finished_batch_and_may_change_its_shape(
    shards: Path, make: MakeLoader
):
    def shrink(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.avg_pool2d(x, 2)

    plain = [x for x, _ in make(shards, 8, num_workers=2, shuffle=False)]
    aug = Augment(size=(16, 16), transform=shrink, transform_on="device")
    got = [x for x, _ in make(shards, 8, num_workers=2, shuffle=False, augment=aug)]
    assert [g.shape for g in got] == [(len(p), 3, 8, 8) for p in plain]
    assert all(torch.allclose(g, shrink(p)) for g, p in zip(got, plain, strict=True))


@pytest.mark.parametrize("decoder", ["auto", "workers"])
def test_a_worker_transform_with_gpu_preprocessing_is_a_clear_error(
    shards: Path, make: MakeLoader, decoder: str
):
    aug = Augment(size=(16, 16), transform=Invert())
    loader = make(shards, 8, num_workers=0, preprocess="gpu", decoder=decoder, augment=aug)
    with pytest.raises(ValueError, match=r"transform_on='worker'\) needs preprocess='cpu'"):
        next(iter(loader))


@pytest.mark.parametrize("preprocess", ["cpu", "gpu"])
def test_on_a_cpu_device_the_feeder_converts_on_one_thread_and_leaves_the_loops_threads(
    shards: Path, monkeypatch: pytest.MonkeyPatch, preprocess: str
):
    from gpufeed.data.device import threads_are_per_thread

    calls = []  # (thread name, threads asked for), recorded on the way to torch
    set_threads = torch.set_num_threads

    def recording(n: int) -> None:
        calls.append((threading.current_thread().name, n))
        set_threads(n)

    monkeypatch.setattr(torch, "set_num_threads", recording)
    before = torch.get_num_threads()
    aug = Augment(size=(16, 16))
    with Loader(shards, 4, num_workers=1, augment=aug, preprocess=preprocess) as loader:
        batches = [x for x, _ in loader]
    assert batches and batches[0].dtype == torch.float32
    # workers that finished the batches: no OpenMP threads woken for converting them in the
    # training process, beside the workers (a device stage that decodes keeps its threads); the
    # training thread's own setting (a CPU model's threads) is as it was
    one = preprocess == "cpu" and threads_are_per_thread()
    assert calls == ([("gpufeed-feeder", 1)] if one else [])
    assert torch.get_num_threads() == before
