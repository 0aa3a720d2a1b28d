"""Loader epochs and ranks: whole batches per rank (only the last may be partial), each sample once
per epoch across the ranks, each iteration the next epoch; `set_epoch` and `loader.sampler`.

Resumption mid-epoch: test_loader_resume.py; resuming on other counts of ranks or workers:
test_elastic_resume.py.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
import torch
from loader_helpers import MakeLoader, _batches, _epoch, _state_after

from gpufeed.data.dataset import ShardDataset

# --- batches per epoch --------------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
def test_unshuffled_batches_arrive_in_the_packed_order_whatever_the_workers(
    shards: Path, make: MakeLoader, num_workers: int
):
    packed = [s.label for s in ShardDataset(shards, shuffle=False).iter_worker(0, 1)]
    loader = make(shards, 5, num_workers=num_workers, shuffle=False)
    assert _epoch(loader) == packed
    assert _epoch(loader) == packed  # the next epoch too (workers ran on into it)


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
