"""Readers of one shard that check what the index promises: `VerifyingReader` (a shard read
from its first byte: its SHA-256 checked, or for `gpufeed index` computed) and `RangeReader` (a
remote shard as chunked ranged GETs with read-ahead: its SHA-256 when read whole, and a verified
copy kept in the cache)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import tempfile
import warnings
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from gpufeed.data.index_file import SHA256_HEX, ShardEntry
from gpufeed.data.partials import partial_prefix
from gpufeed.data.shards import ShardError
from gpufeed.text import visible


class RangeSource(Protocol):
    """What a `RangeReader` needs of the reader that opened it (a `Source`)."""

    url: str
    cache_dir: Path | None
    chunk_size: int
    read_ahead: int
    _cache_failed: bool

    def path(self, name: str) -> str: ...

    def fetch_range(
        self, entry: ShardEntry, start: int, end: int, check_end: bool = False
    ) -> bytes: ...


class ChecksumError(ShardError):
    """A shard's bytes do not have the SHA-256 its index records."""


def _mismatch(where: str, got: str, want: str) -> ChecksumError:
    return ChecksumError(
        f"shard {where}: its SHA-256 is {got}, the index says {want}: the shard was changed "
        "after packing or is corrupt; re-create it with `gpufeed pack` or restore it"
    )


class VerifyingReader(io.RawIOBase):
    """A shard read from its first byte: hashes and counts what is read and, at its end, checks
    the SHA-256 against the index (a ChecksumError if it differs; `verified()` if it matches).
    An entry without a checksum (`gpufeed index` computing one) is only hashed: `digest` holds it
    at the end. `seen(n)` is told of every `n` bytes read (a progress bar)."""

    def __init__(
        self,
        f: io.RawIOBase | io.BufferedIOBase,
        entry: ShardEntry,
        where: str,
        verified: Callable[[], Any] = lambda: None,
        seen: Callable[[int], Any] | None = None,
    ) -> None:
        self._f, self.entry, self.where, self._verified = f, entry, where, verified
        self._seen = seen
        self._hash: Any = hashlib.sha256()
        self.count = 0  # bytes read
        self.digest = ""  # the SHA-256, once read to the end

    def readable(self) -> bool:
        return True

    @property
    def verifying(self) -> bool:
        """Reading on to the shard's end checks its SHA-256 (see `Source.finish`)."""
        return self._hash is not None

    def readinto(self, b: Any) -> int:
        n = self._f.readinto(b)
        if n:
            self.count += n
            if self._hash is not None:
                self._hash.update(memoryview(b)[:n])
            if self._seen is not None:
                self._seen(n)
        elif self._hash is not None:
            self.digest, self._hash = self._hash.hexdigest(), None
            if self.entry.sha256:
                if self.digest != self.entry.sha256:
                    raise _mismatch(self.where, self.digest, self.entry.sha256)
                self._verified()
        return n or 0

    def close(self) -> None:
        if not self.closed:
            self._f.close()
        super().close()


class RangeReader(io.RawIOBase):
    """Sequential reader over a remote shard: chunked ranged GETs with `read_ahead` in flight.
    Opened at byte 0, it hashes what it delivers and checks the SHA-256 at the end of the shard
    (a ShardError if it differs); with `cache_to`, a verified shard is then kept there."""

    def __init__(
        self,
        source: RangeSource,
        entry: ShardEntry,
        start: int,
        cache_to: Path | None = None,
        end: int | None = None,
    ) -> None:
        self.source, self.entry = source, entry
        self.pos = start
        self._next = start  # first byte not yet requested
        self._bound = entry.bytes if end is None else min(end, entry.bytes)  # the caller's end
        self._end = entry.bytes if cache_to is not None else self._bound
        self._buf = memoryview(b"")
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="gpufeed-readahead")
        self._pending: deque[Future[bytes]] = deque()
        verify = (
            start == 0
            and self._end == entry.bytes
            and SHA256_HEX.fullmatch(entry.sha256) is not None
        )
        self._hash: Any = hashlib.sha256() if verify else None
        self._cache_to = cache_to if verify else None
        self._tmp: Any = None  # the cache copy being written, and its name
        self._tmp_name = ""
        self._failed = False  # a fetch raised: what was read is not the whole shard
        if self._cache_to is not None:
            try:
                self._cache_to.parent.mkdir(parents=True, exist_ok=True)
                fd, self._tmp_name = tempfile.mkstemp(
                    dir=self._cache_to.parent, prefix=partial_prefix(self._cache_to.name)
                )
                os.fchmod(fd, 0o644)  # as an ordinary file (mkstemp makes it private to its owner)
                self._tmp = os.fdopen(fd, "wb")
            except OSError as e:
                self._drop_cache(e)
        self._fill()

    def _fill(self) -> None:
        while len(self._pending) <= self.source.read_ahead and self._next < self._end:
            end = min(self._next + self.source.chunk_size, self._end)
            last = end == self.entry.bytes
            self._pending.append(
                self._pool.submit(self.source.fetch_range, self.entry, self._next, end, last)
            )
            self._next = end

    def readable(self) -> bool:
        return True

    @property
    def verifying(self) -> bool:
        """Reading on to the shard's end checks its SHA-256 and keeps the cache copy (see
        `Source.finish`): a reader from byte 0 that writes one, or that was opened to the end."""
        return self._hash is not None

    def readinto(self, b: Any) -> int:
        if not self._buf:
            if not self._pending:
                self._finish_cache()
                return 0
            try:
                chunk = self._pending.popleft().result()
            except BaseException:
                self._failed = True
                raise
            self._fill()
            if self._tmp is not None:
                try:
                    self._tmp.write(chunk)
                except OSError as e:  # a full disk: the shard streams on, uncached
                    self._drop_cache(e)
            if self._hash is not None:
                self._hash.update(chunk)
            self._buf = memoryview(chunk)
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        self.pos += n
        return n

    def _drop_cache(self, error: OSError) -> None:
        """Stop writing the cache copy (it cannot be written: a read-only or full cache_dir);
        the shard is read and checked all the same. Said once per process."""
        if self._tmp is not None:
            with contextlib.suppress(OSError):
                self._tmp.close()
        if self._tmp_name:
            with contextlib.suppress(OSError):
                os.unlink(self._tmp_name)
        self._tmp, self._tmp_name, self._cache_to = None, "", None
        if self._bound < self._end:  # read only what the caller reads: no copy, no whole shard
            self._end, self._hash = self._bound, None
        if not self.source._cache_failed:
            self.source._cache_failed = True
            warnings.warn(
                f"cache_dir {visible(self.source.cache_dir)}: cannot write "
                f"({error.strerror or error}); shards are read from {visible(self.source.url)} "
                "uncached. "
                "Free space or give a writable cache_dir",
                RuntimeWarning,
                stacklevel=2,
            )

    def _finish_cache(self) -> None:
        """At the end of the shard: check the SHA-256, then keep the copy in the cache."""
        if self._hash is None:
            return
        got, self._hash = self._hash.hexdigest(), None
        tmp, self._tmp = self._tmp, None
        if tmp is not None:
            tmp.close()
        if got != self.entry.sha256:
            if tmp is not None:
                os.unlink(self._tmp_name)
            raise _mismatch(self.source.path(self.entry.name), got, self.entry.sha256)
        if tmp is not None and self._cache_to is not None:
            try:
                os.replace(self._tmp_name, self._cache_to)
            except OSError:  # e.g. a directory in the way: just not cached
                with contextlib.suppress(OSError):
                    os.unlink(self._tmp_name)

    def close(self) -> None:
        if not self.closed:
            near_end = self.entry.bytes - self.pos <= 2 * self.source.chunk_size
            if self._tmp is not None and not self._failed and near_end:
                # stopped just short of the end (the tar trailer): finish so the cache is complete
                buf = bytearray(self.source.chunk_size)
                try:
                    while self.readinto(buf):
                        pass
                except Exception as e:  # never raise from close(): the copy is just not kept
                    warnings.warn(f"not cached: {visible(e)}", RuntimeWarning, stacklevel=2)
            for fut in self._pending:
                fut.cancel()
            self._pool.shutdown(wait=False, cancel_futures=True)
            if self._tmp is not None:  # stopped early: the partial copy is not a cache entry
                self._tmp.close()
                with contextlib.suppress(OSError):  # removed as stale already?
                    os.unlink(self._tmp_name)
                self._tmp = None
        super().close()
