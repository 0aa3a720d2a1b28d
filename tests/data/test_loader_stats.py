"""The Loader's `stats()`: throughput, waits (one first-batch wait per epoch started, resumed ones
too) and settings, with the same keys before the first batch.

Corrupt samples in the stats: test_loader_workers.py.
"""

from __future__ import annotations

from pathlib import Path

from loader_helpers import MakeLoader, _epoch, workers_decoder_name


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
    assert st["decoder"] == workers_decoder_name()


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
