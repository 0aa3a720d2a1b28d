"""ShardDataset: exactly-once splitting across ranks and workers, epoch-seeded order, resumption."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from gpufeed.data.dataset import ShardDataset, shuffle_buffer_order
from gpufeed.data.shards import ShardError
from gpufeed.errors import OptionError


def _labels(ds: ShardDataset, num_workers: int) -> list[int]:
    return [s.label for w in range(num_workers) for s in ds.iter_worker(w, num_workers)]


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("workers", [1, 2, 4])
def test_every_sample_exactly_once_per_epoch_across_ranks_and_workers(shards: Path, world, workers):
    seen = []
    for rank in range(world):
        ds = ShardDataset(shards, rank=rank, world_size=world, shuffle_buffer=8)
        ds.set_epoch(3)
        got = _labels(ds, workers)
        assert len(got) == len(ds) == 48 // world
        seen += got
    assert sorted(seen) == list(range(48))


def test_uneven_split_pads_or_drops_so_all_ranks_get_the_same_count(shards: Path):
    # 48 samples over 5 ranks: pad to 10 each (2 samples twice) or drop to 9 each (3 left out)
    padded = [_labels(ShardDataset(shards, rank=r, world_size=5), 2) for r in range(5)]
    assert {len(p) for p in padded} == {10}
    counts = Counter(x for p in padded for x in p)
    assert set(counts) == set(range(48)) and sum(c == 2 for c in counts.values()) == 2
    dropped = [
        _labels(ShardDataset(shards, rank=r, world_size=5, drop_last=True), 2) for r in range(5)
    ]
    assert {len(p) for p in dropped} == {9}
    flat = [x for p in dropped for x in p]
    assert len(set(flat)) == 45


def test_shuffle_differs_across_epochs_and_is_reproducible_for_a_seed(shards: Path):
    def order(epoch: int, seed: int) -> list[int]:
        ds = ShardDataset(shards, seed=seed)
        ds.set_epoch(epoch)
        return _labels(ds, 2)

    assert order(0, 7) == order(0, 7)
    assert order(0, 7) != order(1, 7)
    assert order(0, 7) != order(0, 8)
    assert sorted(order(1, 7)) == list(range(48))


def test_no_shuffle_reads_in_pack_order(shards: Path):
    ds = ShardDataset(shards, shuffle=False)
    keys = [s.key for s in ds.iter_worker(0, 1)]
    assert keys == [k for e in ds.index.shards for k in e.keys]


@pytest.mark.parametrize("skip", [0, 1, 13, 23, 24])
def test_resuming_after_k_samples_delivers_exactly_the_rest(shards: Path, skip: int):
    ds = ShardDataset(shards, shuffle_buffer=16)
    ds.set_epoch(5)
    full = [s.label for s in ds.iter_worker(1, 2)]
    rest = [s.label for s in ds.iter_worker(1, 2, skip=skip)]
    assert rest == full[skip:]


@pytest.mark.parametrize("size", [-1, 0, 2.5, "8"])
def test_a_shuffle_buffer_that_is_not_a_count_is_refused(shards: Path, size):
    with pytest.raises(ValueError, match=rf"shuffle_buffer={size!r}: give a number of samples"):
        ShardDataset(shards, shuffle_buffer=size)


def test_shuffle_buffer_order_is_a_permutation_with_bounded_lookahead():
    rng = np.random.default_rng(0)
    out = shuffle_buffer_order(1000, 50, rng)
    assert sorted(out) == list(range(1000))
    assert all(pos <= t + 49 for t, pos in enumerate(out))
    assert out != list(range(1000))


def test_rank_and_world_size_come_from_the_environment(shards: Path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    ds = ShardDataset(shards)
    assert (ds.rank, ds.world_size, len(ds)) == (1, 4, 12)


def test_a_home_relative_path_is_read(shards: Path, monkeypatch):
    monkeypatch.setenv("HOME", str(shards.parent))
    assert len(ShardDataset(f"~/{shards.name}")) == len(ShardDataset(shards))


def test_a_glob_is_refused_saying_what_to_give(shards: Path):
    # it said "shard *.tar is not in the index ... index it first with `gpufeed index`"
    with pytest.raises(OptionError, match=r"a glob is not read; give the data set's folder"):
        ShardDataset(f"{shards}/*.tar")


def test_missing_index_is_a_clear_error(tmp_path: Path):
    with pytest.raises(ShardError, match=r"index\.json not found.*gpufeed pack"):
        ShardDataset(tmp_path)
