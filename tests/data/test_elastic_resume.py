"""Elastic resumption (issue 38): a Loader state saved mid-epoch with N workers on W ranks resumes
on other counts. Every sample of that epoch not yet delivered comes exactly once across the new
ranks and workers (but the padding a normal epoch has), none delivered comes again, and the
next epoch is a normal one on the new counts. Real Loaders with real worker processes; the
ranks of a DDP job are real torchrun processes (gloo)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpufeed.data.augment import Augment
from gpufeed.data.dataset import ShardDataset
from gpufeed.data.loader import Loader
from gpufeed.data.plan import BatchPlan, Position
from gpufeed.data.resume import merge_states
from gpufeed.errors import OptionError

TINY = Augment(size=(8, 8))
# what every Loader of a test shares; the counts (ranks, workers) are what change
SETTINGS: dict[str, Any] = {"seed": 7, "shuffle_buffer": 8, "augment": TINY, "device": "cpu"}
ALL = 48  # samples of the `shards` fixture

MakeLoader = Callable[..., Loader]


@pytest.fixture
def make(shards: Path) -> Iterator[MakeLoader]:
    """`make(batch_size=4, **options)`: a Loader over `shards` handing out each sample's key,
    closed after the test."""
    made: list[Loader] = []

    def new(batch_size: int = 4, **kw: Any) -> Loader:
        loader = Loader(shards, batch_size, extras=("__key__",), **{**SETTINGS, **kw})
        made.append(loader)
        return loader

    yield new
    for loader in made:
        loader.close()


def _take(loader: Loader, batches: int) -> tuple[list[str], dict[str, Any], Iterator]:
    """The keys of the first `batches` batches of the loader's next iteration, its state then,
    and the iteration (to go on with)."""
    it, keys = iter(loader), []
    for _ in range(batches):
        keys += next(it)[2]
    return keys, loader.state_dict(), it


def _rest(loader: Loader | Iterator) -> list[list[str]]:
    """The keys of each batch of the loader's next iteration (or left of an iteration)."""
    return [list(keys) for _, _, keys in loader]


def _flat(batches: list[list[str]]) -> list[str]:
    return [k for b in batches for k in b]


def _keys_of(shards: Path, ids: Any) -> list[str]:
    by_id = [k for s in ShardDataset(shards).index.shards for k in s.keys]
    return [by_id[int(i)] for i in ids]


def _all_keys(shards: Path) -> set[str]:
    return set(_keys_of(shards, range(ALL)))


def _assert_the_rest_exactly_once(before: list[str], after: list[str], every: set[str]) -> None:
    assert len(before) == len(set(before)), "a sample came twice before the save"
    assert not set(before) & set(after), "a sample delivered before the save came again"
    assert [k for k, n in Counter(after).items() if n > 1] == [], "a sample came twice after"
    assert set(before) | set(after) == every, "a sample of the epoch never came"


# --- the plan: what a state says was delivered, and a remainder epoch ---------------------------


def _made(plan: BatchPlan, epoch: int) -> dict[int, list[str]]:
    """Batch index -> keys, for every batch of `epoch`, made by the plan's workers in turn."""
    out: dict[int, list[str]] = {}
    for w in range(plan.workers):
        for at, samples in plan.worker_batches(w, Position(epoch, 0)):
            if at.epoch != epoch:
                break
            out[at.batch] = [s.key for s in samples]
    return out


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_the_plan_knows_which_samples_its_first_batches_hold_without_reading(
    shards: Path, shuffle: bool, workers: int
):
    plan = BatchPlan(
        ShardDataset(shards, seed=3, shuffle=shuffle, shuffle_buffer=8), 5, workers, False
    )
    made = _made(plan, 2)
    for k in (0, 1, 4, 10):  # 10 batches: 9 of 5 and one of 3
        expected = [key for j in range(k) for key in made[j]]
        assert sorted(_keys_of(shards, plan.delivered(2, k))) == sorted(expected)


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_a_remainder_epoch_is_cut_and_dealt_like_any_epoch(
    shards: Path, shuffle: bool, workers: int
):
    ds = ShardDataset(shards, seed=3, shuffle=shuffle, shuffle_buffer=8)
    ids = np.arange(5, 40, 2)  # 18 ids: batches of 4, 4, 4, 4, 2
    plan = BatchPlan(ds, 4, workers, False, remainder=(1, ids))
    assert (plan.batches_in(1), plan.batches_in(2), plan.batches) == (5, 12, 12)
    made = _made(plan, 1)
    assert [len(made[j]) for j in range(5)] == [4, 4, 4, 4, 2]
    assert sorted(k for b in made.values() for k in b) == sorted(_keys_of(shards, ids))
    if not shuffle:  # batch j is the ids j·b.., whatever the workers
        assert [k for j in range(5) for k in made[j]] == _keys_of(shards, ids)
    assert plan.next_position(Position(1, 4)) == Position(2, 0)
    assert _made(plan, 2) == _made(BatchPlan(ds, 4, workers, False), 2)  # then as usual


# --- other numbers of workers, one rank ---------------------------------------------------------


@pytest.mark.parametrize(("saved", "resumed"), [(2, 3), (3, 2), (1, 2)])
def test_other_worker_counts_deliver_the_rest_of_the_epoch_exactly_once(
    shards: Path, make: MakeLoader, saved: int, resumed: int
):
    before, state, _ = _take(make(num_workers=saved), 3)  # 12 of 48 delivered
    assert (state["epoch"], state["batch"], state["num_workers"]) == (0, 3, saved)
    loader = make(num_workers=resumed)
    loader.load_state_dict(state)
    assert len(loader) == 9  # the 36 left, in batches of 4
    after = _rest(loader)
    assert [len(b) for b in after] == [4] * 9
    _assert_the_rest_exactly_once(before, _flat(after), _all_keys(shards))
    # the next epoch is a normal one on the new counts: the batches a fresh loader makes
    assert len(loader) == 9 and loader.state_dict()["epoch"] == 1
    following = _rest(loader)
    fresh = make(num_workers=resumed)
    fresh.set_epoch(1)
    assert following == _rest(fresh) and len(loader) == 12
    assert "stages" not in loader.state_dict()


def test_a_state_saved_inside_a_resumed_epoch_resumes_again_on_any_counts(
    shards: Path, make: MakeLoader
):
    """2 workers, then 3 within one epoch: the state saved on 3 records the stage on 2 before
    it, so it resumes on 3 where it stopped (in order) and on 2 with the rest shared anew."""
    first, state, _ = _take(make(num_workers=2), 2)  # 8 delivered, 40 left: 10 batches
    three = make(num_workers=3)
    three.load_state_dict(state)
    second, state, it = _take(three, 4)  # 16 more, 24 left: 6 batches
    assert state["stages"] == [{"world_size": 1, "num_workers": 2, "batches": [2]}]
    assert (state["epoch"], state["batch"], state["num_workers"]) == (0, 4, 3)
    # the same counts as the save resume that stretch exactly where it stopped, in order
    same = make(num_workers=3)
    same.load_state_dict(state)
    assert len(same) == 10
    rest_same = _rest(same)
    rest_three = _rest(it)
    assert rest_same == rest_three and len(rest_same) == 6
    # other counts: the stages so far, and then the rest shared anew
    two = make(num_workers=2)
    two.load_state_dict(state)
    assert len(two) == 6 and len(two.state_dict()["stages"]) == 2
    third = _rest(two)
    _assert_the_rest_exactly_once(first + second, _flat(third), _all_keys(shards))
    assert sorted(_flat(third)) == sorted(_flat(rest_three))


def test_one_worker_and_none_plan_alike_so_they_resume_as_the_same_counts(
    shards: Path, make: MakeLoader
):
    before, state, _ = _take(make(num_workers=1), 5)
    inline = make(num_workers=0)
    inline.load_state_dict(state)
    assert len(inline) == 12  # the usual epoch, from batch 5
    whole = _flat(_rest(make(num_workers=1)))
    assert before == whole[:20] and _flat(_rest(inline)) == whole[20:]


def test_a_state_at_an_epochs_start_resumes_as_a_normal_epoch_on_the_new_counts(
    shards: Path, make: MakeLoader
):
    _, state, _ = _take(make(num_workers=2), 12)  # the whole of epoch 0
    assert (state["epoch"], state["batch"]) == (1, 0)
    loader = make(num_workers=3)
    loader.load_state_dict(state)
    fresh = make(num_workers=3)
    fresh.set_epoch(1)
    assert _rest(loader) == _rest(fresh)


def test_loading_a_state_into_a_loader_whose_workers_run_starts_them_on_the_new_plan(
    shards: Path, make: MakeLoader
):
    before, state, _ = _take(make(num_workers=2), 3)
    loader = make(num_workers=3)
    _take(loader, 2)  # its workers run ahead on the usual plan of epoch 0
    loader.load_state_dict(state)
    _assert_the_rest_exactly_once(before, _flat(_rest(loader)), _all_keys(shards))


# --- other numbers of ranks, in one process (explicit ranks) ------------------------------------


@pytest.mark.parametrize("drop_last", [False, True])
def test_three_new_ranks_share_the_rest_evenly_padding_or_dropping_as_an_epoch_does(
    shards: Path, make: MakeLoader, drop_last: bool
):
    """40 left over 3 ranks: drop_last=False gives each 14 (the first 2 of the rest come twice,
    as a normal epoch pads), drop_last=True 12 (13 each, less the partial batch): every rank
    has the same number of batches, as DDP needs."""
    before, state, _ = _take(make(num_workers=1, drop_last=drop_last), 2)
    ranks = [make(num_workers=2, rank=r, world_size=3, drop_last=drop_last) for r in range(3)]
    for loader in ranks:
        loader.load_state_dict(state)
    assert [len(loader) for loader in ranks] == [3 if drop_last else 4] * 3
    after = [_flat(_rest(loader)) for loader in ranks]
    got = [k for keys in after for k in keys]
    left = _all_keys(shards) - set(before)
    assert not set(before) & set(got) and len(left) == 40
    if drop_last:
        assert [len(keys) for keys in after] == [12] * 3
        assert len(set(got)) == 36 and set(got) <= left  # 4 of the rest dropped
    else:
        assert [len(keys) for keys in after] == [14] * 3
        assert set(got) == left
        twice = [k for k, n in Counter(got).items() if n > 1]
        assert len(twice) == 2 and set(twice) <= set(after[0])  # the padding wraps to rank 0's
    for loader in ranks:  # then a normal epoch: 16 each
        assert len(_flat(_rest(loader))) == 16


def test_ranks_that_delivered_different_counts_resume_from_their_merged_states(
    shards: Path, make: MakeLoader
):
    old = [make(num_workers=1, rank=r, world_size=2) for r in range(2)]
    taken = [_take(old[0], 1), _take(old[1], 4)]
    state = merge_states([s for _, s, _ in reversed(taken)])
    assert state["rank"] == 0 and state["rank_batches"] == [1, 4]
    loader = make(num_workers=2)
    loader.load_state_dict(state)
    assert len(loader) == 7  # 48 - 4 - 16 = 28 left
    before = taken[0][0] + taken[1][0]
    _assert_the_rest_exactly_once(before, _flat(_rest(loader)), _all_keys(shards))
    with pytest.raises(OptionError, match="every rank's state once"):
        merge_states([taken[0][1]])


# --- refused ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"), [("seed", 8), ("batch_size", 8), ("samples", 50), ("index", "0" * 16)]
)
def test_a_state_of_other_data_or_settings_is_refused_on_any_counts(
    shards: Path, make: MakeLoader, key: str, value: Any
):
    state = {**make(num_workers=2).state_dict(), "batch": 3, "world_size": 2}
    loader = make(num_workers=0, rank=1, world_size=3, **({key: value} if key == "seed" else {}))
    if key != "seed":
        state[key] = value
    with pytest.raises(OptionError, match=rf"saved with {key}=.*resume with the same {key}"):
        loader.load_state_dict(state)


def test_other_counts_resume_into_the_training_process_itself(shards: Path, make: MakeLoader):
    before, state, _ = _take(make(num_workers=2), 3)  # 12 of 48 delivered
    inline = make(num_workers=0)
    inline.load_state_dict(state)
    assert len(inline) == 9
    _assert_the_rest_exactly_once(before, _flat(_rest(inline)), _all_keys(shards))


def test_a_state_counting_more_batches_than_its_ranks_had_is_refused(make: MakeLoader):
    state = {**make(num_workers=2).state_dict(), "batch": 13}
    with pytest.raises(OptionError, match=r"delivered 13 batches of epoch 0, which has 12"):
        make(num_workers=3).load_state_dict(state)


# --- other numbers of ranks: real torchrun processes ---------------------------------------------

SCRIPT = """
import json, sys
import torch.distributed as dist
from gpufeed.data.augment import Augment
from gpufeed.data.loader import Loader

dist.init_process_group("gloo")
rank = dist.get_rank()
loader = Loader({shards!r}, 4, num_workers={workers}, seed=7, shuffle_buffer=8,
                augment=Augment(size=(8, 8)), device="cpu", extras=("__key__",))
out = {{"rank": rank}}
if sys.argv[1] == "save":  # deliver some batches of epoch 0, save the state
    it, keys = iter(loader), []
    for _ in range(int(sys.argv[2])):
        keys += next(it)[2]
    out.update(keys=keys, state=loader.state_dict())
else:  # resume from a state: the rest of its epoch, then the next
    loader.load_state_dict(json.load(open(sys.argv[2])))
    out["len"] = len(loader)
    out["rest"] = [list(k) for _, _, k in loader]
    out["next"] = [list(k) for _, _, k in loader]
    out["next_len"] = len(loader)
json.dump(out, open({out!r} + f"/rank{{rank}}.json", "w"))
loader.close()
dist.destroy_process_group()
"""


def _torchrun(tmp_path: Path, shards: Path, ranks: int, workers: int, *args: str) -> list[dict]:
    """Run SCRIPT on `ranks` real torchrun processes (gloo); each rank's output."""
    out = tmp_path / f"out-{len(list(tmp_path.glob('out-*')))}"
    out.mkdir()
    script = tmp_path / "ddp.py"
    script.write_text(
        textwrap.dedent(SCRIPT.format(shards=str(shards), workers=workers, out=str(out)))
    )
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
           "--nproc-per-node", str(ranks), "--master-addr", "127.0.0.1",
           "--master-port", str(port), str(script), *args]  # fmt: skip
    cp = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert cp.returncode == 0, cp.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]


@pytest.mark.timeout(600)
def test_two_torchrun_ranks_resume_on_one(shards: Path, make: MakeLoader, tmp_path: Path):
    saved = _torchrun(tmp_path, shards, 2, 2, "save", "2")  # 2 batches on each rank: 16
    before = saved[0]["keys"] + saved[1]["keys"]
    state = saved[0]["state"]  # rank 0's, as trainers save it
    assert (state["world_size"], state["rank"], state["batch"]) == (2, 0, 2)
    loader = make(num_workers=3)  # one rank, other workers too
    loader.load_state_dict(state)
    assert len(loader) == 8  # the 32 left
    _assert_the_rest_exactly_once(before, _flat(_rest(loader)), _all_keys(shards))
    fresh = make(num_workers=3)
    fresh.set_epoch(1)
    assert _rest(loader) == _rest(fresh)  # then a normal epoch on one rank


@pytest.mark.timeout(600)
def test_one_rank_resumes_on_two_torchrun_ranks(shards: Path, make: MakeLoader, tmp_path: Path):
    before, state, _ = _take(make(num_workers=2), 3)  # 12 of 48
    (tmp_path / "state.json").write_text(json.dumps(state))
    ranks = _torchrun(tmp_path, shards, 2, 1, "resume", str(tmp_path / "state.json"))
    assert [r["len"] for r in ranks] == [5, 5]  # 18 each of the 36 left: equal batch counts
    assert [len(r["rest"]) for r in ranks] == [5, 5]
    after = _flat(ranks[0]["rest"]) + _flat(ranks[1]["rest"])
    _assert_the_rest_exactly_once(before, after, _all_keys(shards))
    # then a normal epoch on two ranks: 24 each, every sample once
    assert [r["next_len"] for r in ranks] == [6, 6]
    following = _flat(ranks[0]["next"]) + _flat(ranks[1]["next"])
    assert sorted(following) == sorted(_all_keys(shards))
