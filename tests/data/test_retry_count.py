"""`retried` counts each request sent again after a failure once, whichever layer sent it again:
real faults (HTTP 500s and TCP resets) injected by a loopback proxy in front of a moto S3 server.

A reset GET is sent again at once by aiohttp, below botocore, which never saw it: such retries
went uncounted (51 counted for 77 faults). Retries a Loader's process made before forking its
workers (the index read) were counted once per worker."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from gpufeed.data.augment import Augment
from gpufeed.data.loader import Loader
from gpufeed.data.source import Source

SMALL = Augment(size=(16, 16))
BOTOCORE_OFF = {"config_kwargs": {"retries": {"total_max_attempts": 1}}}


def _cap_faults(proxy: Any, most: int) -> None:
    """Have `proxy` inject no more than `most` faults (every 2nd shard GET until then)."""
    proxy.every = 2
    inner, lock = proxy._fault, threading.Lock()

    def capped(method: str, path: str) -> str | None:
        with lock:
            if sum(proxy.injected.values()) >= most:
                return None
            return inner(method, path)

    proxy._fault = capped


@pytest.mark.parametrize("options", [None, BOTOCORE_OFF], ids=["botocore-retries", "gpufeed-only"])
def test_a_source_counts_every_fault_it_retried_once(
    s3_shards: str, faulty_proxy: Any, monkeypatch: pytest.MonkeyPatch, options: Any
):
    monkeypatch.setenv("AWS_ENDPOINT_URL", faulty_proxy.url)
    faulty_proxy.every = 2
    source = Source(s3_shards, storage_options=options, chunk_size=4096)
    entries = source.read_index().shards
    for entry in entries:
        f = source.open(entry, 0)
        assert len(f.read()) == entry.bytes  # read whole: the SHA-256 is checked
        source.finish(f)
    injected = faulty_proxy.injected
    assert injected["500"] >= 3 and injected["reset"] >= 3, injected
    assert source.retried == injected["500"] + injected["reset"], injected


def _iterate_until(loader: Loader, done: Callable[[], bool], epochs: int = 12) -> None:
    """Whole epochs until `done()`, at most `epochs` of them (reports lag behind reads: a
    worker's retries ride on its next batch)."""
    for _ in range(epochs):
        assert sorted(int(x) for _, y in loader for x in y) == list(range(48))
        if done():
            return


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_stats_count_each_injected_fault_once(
    s3_shards: str, faulty_proxy: Any, monkeypatch: pytest.MonkeyPatch, workers: int
):
    monkeypatch.setenv("AWS_ENDPOINT_URL", faulty_proxy.url)
    faults = 10
    _cap_faults(faulty_proxy, faults)
    loader = Loader(s3_shards, 5, num_workers=workers, chunk_size=4096, augment=SMALL)
    try:
        injected = faulty_proxy.injected
        _iterate_until(
            loader,
            lambda: sum(injected.values()) == faults and loader.stats()["retried"] >= faults,
        )
        assert injected["500"] > 0 and injected["reset"] > 0, injected
        assert sum(injected.values()) == faults
        assert loader.stats()["retried"] == faults
    finally:
        loader.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_a_retried_index_read_is_counted_once_whatever_the_workers(
    s3_shards: str, faulty_proxy: Any, monkeypatch: pytest.MonkeyPatch, workers: int
):
    monkeypatch.setenv("AWS_ENDPOINT_URL", faulty_proxy.url)
    faulty_proxy.every = 10**9  # no shard faults
    hit: list[float] = []

    def index_fails_once(method: str, path: str) -> str | None:
        if method == "GET" and "gpufeed-index.json" in path and not hit:
            hit.append(time.monotonic())
            return "500"
        return None

    faulty_proxy._fault = index_fails_once
    loader = Loader(s3_shards, 5, num_workers=workers, chunk_size=4096, augment=SMALL)
    try:
        _iterate_until(loader, lambda: True, epochs=1)
        assert len(hit) == 1
        assert loader.stats()["retried"] == 1  # was 1 per worker: each fork reported it
    finally:
        loader.close()
