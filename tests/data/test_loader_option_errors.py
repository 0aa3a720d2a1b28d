"""Loader options that cannot work as given: an OptionError naming the option and what would do,
raised fast; sizes as text ("1GB") read as bytes."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufeed.data.augment import Augment
from gpufeed.data.loader import Loader
from gpufeed.errors import OptionError

SMALL = Augment(size=(16, 16))


@pytest.fixture
def make() -> Iterator[Callable[..., Loader]]:
    """`make(data, batch_size, **options)`: a CPU Loader, closed after the test."""
    made: list[Loader] = []

    def new(*args: Any, **kw: Any) -> Loader:
        kw.setdefault("augment", SMALL)
        made.append(Loader(*args, device="cpu", **kw))
        return made[-1]

    yield new
    for loader in made:
        loader.close()


# --- max_host_bytes ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "bytes_"),
    [
        ("1GB", 10**9),
        ("512MiB", 512 << 20),
        ("1.5 G", 1_500_000_000),
        ("2gib", 2 << 30),
        (3_000_000_000, 3_000_000_000),
        (4e9, 4_000_000_000),
    ],
)
def test_max_host_bytes_takes_bytes_or_a_size_with_its_unit(
    shards: Path, make: Callable[..., Loader], given: object, bytes_: int
):
    loader = make(shards, 8, num_workers=2, max_host_bytes=given)
    assert loader.max_host_bytes == bytes_
    assert loader.stats()["max_host_bytes"] == bytes_


@pytest.mark.parametrize("given", ["lots", "1 GBB", "-1GB", 1.5, True, [1]])
def test_max_host_bytes_that_is_no_size_is_refused_naming_it(
    shards: Path, make: Callable[..., Loader], given: object
):
    with pytest.raises(OptionError, match=r"max_host_bytes=.*'4GB'.*'512MiB'"):
        make(shards, 8, num_workers=2, max_host_bytes=given)


@pytest.mark.parametrize("given", [0, -5, "0GB"])
def test_max_host_bytes_below_one_byte_is_refused_naming_it(
    shards: Path, make: Callable[..., Loader], given: object
):
    with pytest.raises(OptionError, match=r"max_host_bytes=.* give at least 1"):
        make(shards, 8, num_workers=2, max_host_bytes=given)


# --- prefetch ------------------------------------------------------------------------------------


class _Counting(Loader):
    """A Loader that counts how often its host memory is sized (and stops at a thousand)."""

    calls = 0

    def host_bytes_bound(self, prefetch: int) -> int:
        type(self).calls += 1
        assert type(self).calls <= 1000, "prefetch sized one step at a time"
        return super().host_bytes_bound(prefetch)


def test_a_huge_prefetch_is_fitted_to_the_memory_cap_in_a_few_steps(shards: Path):
    cap = 200_000_000
    t0 = time.monotonic()
    with _Counting(
        shards, 8, num_workers=2, prefetch=1_000_000, max_host_bytes=cap, device="cpu"
    ) as loader:
        took = time.monotonic() - t0
        p = loader.prefetch
        assert 1 < p < 1_000_000
        assert loader.host_bytes_bound(p) <= cap < loader.host_bytes_bound(p + 1)  # the deepest
        assert _Counting.calls <= 100
        assert took < 20  # it took about a minute, one step at a time


# --- remote reads: read_ahead and chunk_size -----------------------------------------------------


def test_a_read_ahead_too_deep_for_memory_names_it_and_the_range_that_fits(
    s3_shards: str, make: Callable[..., Loader]
):
    with pytest.raises(OptionError) as raised:
        make(s3_shards, 8, num_workers=2, read_ahead=1e6)
    message = str(raised.value)
    assert "read_ahead=1000000 chunks" in message
    assert "batch_size" not in message and "shuffle_buffer from" not in message
    assert "pass max_host_bytes=" not in message  # more than the machine has: no fix
    most = int(re.search(r"pass read_ahead from 0 to (\d+)", message).group(1))  # type: ignore[union-attr]
    assert make(s3_shards, 8, num_workers=2, read_ahead=most).dataset.source.read_ahead == most


def test_a_chunk_size_too_large_for_memory_names_it_and_what_fits(
    s3_shards: str, make: Callable[..., Loader]
):
    with pytest.raises(OptionError) as raised:
        make(s3_shards, 8, num_workers=2, chunk_size=10**12)
    message = str(raised.value)
    assert "chunk_size=1,000,000,000,000" in message and "batch_size" not in message
    most = int(
        re.search(r"pass chunk_size up to ([\d,]+) bytes", message).group(1).replace(",", "")
    )  # type: ignore[union-attr]
    assert make(s3_shards, 8, num_workers=2, chunk_size=most).dataset.source.chunk_size == most


def test_a_cap_below_the_batches_slots_says_which_cap_would_do(
    shards: Path, make: Callable[..., Loader]
):
    big = Augment()  # 224×224 batches: their slots need the most
    with pytest.raises(OptionError, match=r"lower batch_size or num_workers; or pass") as raised:
        make(shards, 8, num_workers=2, max_host_bytes="1KB", augment=big)
    need = int(re.search(r"pass max_host_bytes=(\d+)", str(raised.value)).group(1))  # type: ignore[union-attr]
    assert make(shards, 8, num_workers=2, max_host_bytes=need, augment=big).prefetch == 1


def test_a_cap_below_the_shuffle_buffers_names_the_shuffle_buffer_that_fits(
    shards: Path, make: Callable[..., Loader]
):
    cap = 1_500_000  # 16×16 batches: the shuffle buffers of encoded images need the most
    with pytest.raises(OptionError, match=r"shuffle_buffer=256") as raised:
        make(shards, 8, num_workers=2, max_host_bytes=cap)
    fits = int(re.search(r"pass shuffle_buffer from 1 to (\d+)", str(raised.value)).group(1))  # type: ignore[union-attr]
    assert make(shards, 8, num_workers=2, max_host_bytes=cap, shuffle_buffer=fits).prefetch >= 1


# --- worker_timeout ------------------------------------------------------------------------------


@pytest.mark.parametrize("given", [-1, "5", True, float("nan"), float("inf"), [5]])
def test_a_worker_timeout_that_is_no_number_of_seconds_is_refused_naming_it(
    shards: Path, make: Callable[..., Loader], given: object
):
    with pytest.raises(OptionError, match=r"worker_timeout=.*0 to wait without end.*None"):
        make(shards, 8, num_workers=2, worker_timeout=given)


@pytest.mark.parametrize(("given", "kept"), [(None, None), (0, 0.0), (2.5, 2.5), (600, 600.0)])
def test_worker_timeout_takes_none_zero_or_seconds(
    shards: Path, make: Callable[..., Loader], given: object, kept: object
):
    assert make(shards, 8, num_workers=2, worker_timeout=given).worker_timeout == kept
