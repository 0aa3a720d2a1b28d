"""Where shards live: a local directory or `s3://bucket/prefix` (any S3-compatible store, via fsspec).

Remote shards are streamed ("pipe mode") as ranged GETs of `chunk_size` bytes with a read-ahead
thread, so training starts before a shard, let alone the data set, is downloaded. Each chunk is an
idempotent range request retried with exponential backoff, so a retry can never deliver a byte
twice or skip one. With `cache_dir`, a shard read from start to end is verified against its
index checksum and kept on local disk for later epochs and runs.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

from gpufeed.data.shards import INDEX_NAME, Index, ShardEntry, ShardError

MB = 1 << 20


def is_remote(url: str) -> bool:
    """True for URLs fsspec should open (s3://, gs://, ...), false for local paths."""
    return "://" in str(url) and not str(url).startswith("file://")


def s3_options(storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """s3fs options: the endpoint from AWS_ENDPOINT_URL(_S3) unless given; credentials are s3fs's."""
    opts = dict(storage_options or {})
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint and "endpoint_url" not in opts:
        client = dict(opts.get("client_kwargs") or {})
        client.setdefault("endpoint_url", endpoint)
        opts["client_kwargs"] = client
    return opts


_FS_CACHE: dict[tuple[int, str, str], Any] = {}


def filesystem(url: str, storage_options: dict[str, Any] | None = None) -> Any:
    """One fsspec filesystem per process and options (fsspec objects must not cross a fork)."""
    import fsspec

    protocol = str(url).split("://", 1)[0]
    opts = s3_options(storage_options) if protocol in ("s3", "s3a") else dict(storage_options or {})
    key = (os.getpid(), protocol, repr(sorted(opts.items())))
    if key not in _FS_CACHE:
        _FS_CACHE[key] = fsspec.filesystem(protocol, skip_instance_cache=True, **opts)
    return _FS_CACHE[key]


def _transient(exc: BaseException) -> bool:
    return not isinstance(exc, (FileNotFoundError, PermissionError, ShardError, ValueError))


class Source:
    """Read index.json and byte ranges of shards from a local directory or a remote prefix."""

    def __init__(
        self,
        url: str | os.PathLike[str],
        *,
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        retries: int = 6,
        backoff: float = 0.05,
        chunk_size: int = 8 * MB,
        read_ahead: int = 2,
    ) -> None:
        self.url = str(url).rstrip("/")
        self.remote = is_remote(self.url)
        self.storage_options = storage_options
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.retries, self.backoff = retries, backoff
        self.chunk_size, self.read_ahead = max(64 * 1024, chunk_size), max(0, read_ahead)
        self.retried = 0  # transient errors retried in this process

    def path(self, name: str) -> str:
        return f"{self.url}/{name}"

    def read_index(self) -> Index:
        """The data set's index.json, with a clear error when it is missing."""
        where = self.path(INDEX_NAME)
        try:
            if self.remote:
                data = self._retry(
                    lambda: filesystem(self.url, self.storage_options).cat_file(where)
                )
            else:
                data = Path(where).read_bytes()
        except FileNotFoundError:
            raise ShardError(
                f"{where} not found: is {self.url} a directory written by `gpufeed pack`?"
            ) from None
        return Index.from_bytes(data, where)

    def open(self, entry: ShardEntry, start: int = 0) -> BinaryIO:
        """A file-like over shard `entry` from byte `start`; missing/short shards raise ShardError."""
        cached = self._cached(entry)
        if cached is not None:
            f = open(cached, "rb")  # noqa: SIM115 - handed to the caller
            f.seek(start)
            return f
        where = self.path(entry.name)
        if not self.remote:
            try:
                size = os.path.getsize(where)
            except FileNotFoundError:
                raise ShardError(f"shard {where} is missing (listed in index.json)") from None
            if size < entry.bytes:
                raise ShardError(
                    f"shard {where} is truncated: {size} bytes, index.json says {entry.bytes}"
                )
            f = open(where, "rb")  # noqa: SIM115 - handed to the caller
            f.seek(start)
            return f
        cache_to = None
        if self.cache_dir is not None and start == 0:
            cache_to = self._cache_path(entry)
        return io.BufferedReader(
            RangeReader(self, entry, start, cache_to=cache_to), buffer_size=256 * 1024
        )

    def _cache_path(self, entry: ShardEntry) -> Path:
        assert self.cache_dir is not None
        tag = hashlib.sha256(self.url.encode()).hexdigest()[:16]
        return self.cache_dir / tag / f"{entry.sha256[:16] or 'nosum'}-{entry.name}"

    def _cached(self, entry: ShardEntry) -> Path | None:
        if self.cache_dir is None or not self.remote:
            return None
        p = self._cache_path(entry)
        return p if p.is_file() and p.stat().st_size == entry.bytes else None

    def fetch_range(self, entry: ShardEntry, start: int, end: int) -> bytes:
        """Bytes [start, end) of a remote shard, retried with backoff; never short."""
        fs = filesystem(self.url, self.storage_options)
        where = self.path(entry.name)

        def get() -> bytes:
            data = fs.cat_file(where, start=start, end=end)
            if len(data) != end - start:
                info = fs.info(where)
                if int(info.get("size", 0)) < entry.bytes:
                    raise ShardError(
                        f"shard {where} is truncated: {info.get('size')} bytes, "
                        f"index.json says {entry.bytes}"
                    )
                raise OSError(f"short read of {where} [{start}:{end}]: {len(data)} bytes")
            return data

        try:
            return self._retry(get)
        except FileNotFoundError:
            raise ShardError(f"shard {where} is missing (listed in index.json)") from None

    def _retry(self, fn: Any) -> Any:
        for attempt in range(self.retries + 1):
            try:
                return fn()
            except Exception as e:
                if not _transient(e) or attempt == self.retries:
                    raise
                self.retried += 1
                time.sleep(self.backoff * (2**attempt) * (0.5 + random.random()))
        raise AssertionError("unreachable")


class RangeReader(io.RawIOBase):
    """Sequential reader over a remote shard: chunked ranged GETs with `read_ahead` in flight."""

    def __init__(
        self, source: Source, entry: ShardEntry, start: int, cache_to: Path | None = None
    ) -> None:
        self.source, self.entry = source, entry
        self.pos = start
        self._next = start  # first byte not yet requested
        self._buf = memoryview(b"")
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="gpufeed-readahead")
        self._pending: deque[Future[bytes]] = deque()
        self._hash = hashlib.sha256() if cache_to is not None else None
        self._cache_to = cache_to
        self._tmp = None
        if cache_to is not None:
            cache_to.parent.mkdir(parents=True, exist_ok=True)
            self._tmp = open(f"{cache_to}.tmp-{os.getpid()}", "wb")  # noqa: SIM115
        self._fill()

    def _fill(self) -> None:
        while len(self._pending) <= self.source.read_ahead and self._next < self.entry.bytes:
            end = min(self._next + self.source.chunk_size, self.entry.bytes)
            self._pending.append(
                self._pool.submit(self.source.fetch_range, self.entry, self._next, end)
            )
            self._next = end

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if not self._buf:
            if not self._pending:
                self._finish_cache()
                return 0
            chunk = self._pending.popleft().result()
            self._fill()
            if self._tmp is not None:
                self._tmp.write(chunk)
                assert self._hash is not None
                self._hash.update(chunk)
            self._buf = memoryview(chunk)
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        self.pos += n
        return n

    def _finish_cache(self) -> None:
        if self._tmp is None or self._cache_to is None or self._hash is None:
            return
        self._tmp.close()
        tmp, self._tmp = self._tmp.name, None
        if self._hash.hexdigest() == self.entry.sha256:
            os.replace(tmp, self._cache_to)
        else:
            os.unlink(tmp)

    def close(self) -> None:
        if not self.closed:
            if self._tmp is not None and self.entry.bytes - self.pos <= 2 * self.source.chunk_size:
                # stopped just short of the end (the tar trailer): finish so the cache is complete
                buf = bytearray(self.source.chunk_size)
                while self.readinto(buf):
                    pass
            for fut in self._pending:
                fut.cancel()
            self._pool.shutdown(wait=False, cancel_futures=True)
            if self._tmp is not None:  # stopped early: the partial copy is not a cache entry
                self._tmp.close()
                os.unlink(self._tmp.name)
                self._tmp = None
        super().close()


class Destination:
    """Where `pack` writes: atomic whole-file writes to a local directory or a remote prefix."""

    def __init__(self, url: str | os.PathLike[str], storage_options: dict[str, Any] | None = None):
        self.url = str(url).rstrip("/")
        self.remote = is_remote(self.url)
        self.storage_options = storage_options
        if not self.remote:
            Path(self.url).mkdir(parents=True, exist_ok=True)

    def path(self, name: str) -> str:
        return f"{self.url}/{name}"

    def _fs(self) -> Any:
        return filesystem(self.url, self.storage_options)

    def exists(self, name: str) -> bool:
        return self._fs().exists(self.path(name)) if self.remote else Path(self.path(name)).exists()

    def read_bytes(self, name: str) -> bytes:
        return (
            self._fs().cat_file(self.path(name))
            if self.remote
            else Path(self.path(name)).read_bytes()
        )

    def size(self, name: str) -> int:
        if self.remote:
            return int(self._fs().info(self.path(name))["size"])
        return os.path.getsize(self.path(name))

    def write_bytes(self, name: str, data: bytes) -> None:
        """Write atomically: a temporary name then a rename (an S3 PUT is atomic by itself)."""
        if self.remote:
            self._fs().pipe_file(self.path(name), data)
            return
        tmp = f"{self.path(name)}.tmp-{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path(name))

    def put_file(self, local: str, name: str) -> None:
        """Move a finished local file into place atomically."""
        if self.remote:
            self._fs().put_file(local, self.path(name))
            os.unlink(local)
        else:
            os.replace(local, self.path(name))

    def local_tmp(self, name: str) -> str:
        """A temporary local path for building `name` (inside DST when it is local, so the rename is atomic)."""
        if self.remote:
            import tempfile

            fd, p = tempfile.mkstemp(suffix=f"-{name}")
            os.close(fd)
            return p
        return f"{self.path(name)}.tmp-{os.getpid()}"

    def remove_stale_tmp(self) -> int:
        """Delete temporary files a previous, interrupted pack left behind; returns how many."""
        if self.remote:
            return 0
        stale = list(Path(self.url).glob("*.tmp-*"))
        for p in stale:
            p.unlink(missing_ok=True)
        return len(stale)
