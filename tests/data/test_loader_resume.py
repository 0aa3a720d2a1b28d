"""Loader resumption: `state_dict()` says where the rank is in its epochs, `load_state_dict()`
delivers exactly the rest in order, and a state that cannot mean the same samples is refused.

Resuming on other counts of ranks or workers: test_elastic_resume.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
from loader_helpers import MakeLoader, _batches, _epoch, _state_after

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


# --- resuming mid-epoch -------------------------------------------------------------------------


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


def test_rank_0s_state_resumes_every_rank_at_its_own_batches(shards: Path, make: MakeLoader):
    # DDP trainers (Lightning) save rank 0's loader state and load it on every rank
    state = _state_after(make(shards, 4, num_workers=2, rank=0, world_size=2), 1, 2)
    whole = make(shards, 4, num_workers=2, rank=1, world_size=2)
    whole.set_epoch(1)
    resumed = make(shards, 4, num_workers=2, rank=1, world_size=2)
    resumed.load_state_dict(state)
    assert [y for _, y in _batches(resumed)] == [y for _, y in _batches(whole)][2:]


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


# --- the state ----------------------------------------------------------------------------------


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


def test_state_dict_right_after_load_state_dict_is_the_loaded_state(shards: Path, make: MakeLoader):
    state = {**make(shards, 4, num_workers=0).state_dict(), "epoch": 3, "batch": 5}
    loader = make(shards, 4, num_workers=0)
    loader.load_state_dict(state)
    assert loader.state_dict() == state


def test_a_state_saved_without_the_shuffle_settings_still_resumes(shards: Path, make: MakeLoader):
    state = make(shards, 4, num_workers=0).state_dict()
    older = {k: v for k, v in state.items() if k not in ("shuffle", "shuffle_buffer")}
    loader = make(shards, 4, num_workers=0)
    loader.load_state_dict({**older, "batch": 3})
    assert loader.state_dict()["batch"] == 3


# --- states refused -----------------------------------------------------------------------------


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
