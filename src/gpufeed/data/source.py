"""Reading a data set's shards from a local directory or `s3://bucket/prefix` (any S3-compatible
store, via fsspec): `Source`, the shard reader, with its verified cache of remote shards.

Remote shards stream as ranged GETs with read-ahead (`readers`), so training starts before a shard
is downloaded, and what the index promises (each shard's size and SHA-256) is checked as the bytes
are read, so no bytes are trusted that the index does not vouch for. What is checked when, and how
the cache behaves: the shards reference (docs/reference/shards.md) and docs/how-to/s3.md. This
module's old contents live on in `location`, `storage`, `storage_errors`, `readers` and
`destination`, and stay importable from here.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import stat
import warnings
import weakref
from pathlib import Path
from typing import Any, BinaryIO

# This module held all of what follows until it was split (issue 37): every name it had is still
# importable from here (hence the `noqa: F401`), but new code imports each from its own module.
from gpufeed.data.destination import Destination  # noqa: F401
from gpufeed.data.location import _MISTYPED_URL, base_url, is_remote  # noqa: F401
from gpufeed.data.partials import (  # noqa: F401
    pack_tmp,
    partial_prefix,
    remove_partial_files,
    remove_stale_pack_tmp,
)
from gpufeed.data.partials import writer_host as _writer_host  # noqa: F401
from gpufeed.data.readers import (  # noqa: F401
    ChecksumError,
    RangeReader,
    VerifyingReader,
    _mismatch,
)
from gpufeed.data.shards import (
    INDEX_NAME,
    LEGACY_INDEX_NAME,
    SHA256_HEX,
    Index,
    ShardEntry,
    ShardError,
    check_shard_name,
    sha256_file,
)
from gpufeed.data.storage import (  # noqa: F401
    _DICT_OPTIONS,
    _FS_CACHE,
    _HTTP_CALL,
    CONNECT_TIMEOUT,
    DEFAULT_TIMEOUT,
    READ_TIMEOUT,
    Heard,
    _counting_s3_class,
    call_remote,
    check_storage_options,
    filesystem,
    hearing,
    remote_timeout,
    s3_options,
)
from gpufeed.data.storage import Heard as _Heard  # noqa: F401
from gpufeed.data.storage import hearing as _hearing  # noqa: F401
from gpufeed.data.storage_errors import (  # noqa: F401
    _CREDENTIALS,
    _TIMEOUTS,
    _UNREACHABLE,
    MAX_PAUSE,
    _answer,
    _names,
    _refused,
    _response,
    _status,
    _transient,
    answer_of,
    endpoint_of,
    remote_error,
    retrying,
)
from gpufeed.data.storage_errors import answer_of as _answer_of  # noqa: F401
from gpufeed.data.storage_errors import retrying as _retrying  # noqa: F401
from gpufeed.errors import OptionError
from gpufeed.text import MiB, visible


def _forked(*sources: Source) -> None:
    """Copies in a new process report only their own retries (`new_retries`): those made before
    are the original's to report, else each worker reported them once again."""
    for source in sources or list(_SOURCES):
        source._reported = source.retried


_SOURCES: weakref.WeakSet[Source] = weakref.WeakSet()
os.register_at_fork(after_in_child=_forked)


class Source:
    """Read the index and byte ranges of shards from a local directory or a remote prefix."""

    def __init__(
        self,
        url: str | os.PathLike[str],
        *,
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        retries: int = 6,
        backoff: float = 0.05,
        chunk_size: int = 8 * MiB,
        read_ahead: int = 2,
    ) -> None:
        self.url = base_url(url)
        self.remote = is_remote(self.url)
        self.storage_options = check_storage_options(storage_options)
        if cache_dir is not None and not str(cache_dir).strip():
            raise OptionError(
                f"cache_dir={cache_dir!r}: give a folder for the shards read remotely, or leave "
                "it out to stream them uncached"
            )
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else None
        self._cache_failed = False  # said once: the cache cannot be written, shards stream
        self._swept: set[Path] = set()  # cache folders cleared of killed writers' partial files
        self.retries, self.backoff = retries, backoff
        self.chunk_size, self.read_ahead = max(64 * 1024, chunk_size), max(0, read_ahead)
        self.timeout = remote_timeout(storage_options) if self.remote else DEFAULT_TIMEOUT
        self._retried = 0  # transient errors retried here, besides botocore's own retries
        self._http_retried = 0  # botocore's retries of this Source's requests
        self._reached = False  # the endpoint answered once: connection errors may be transient
        self._reported = 0  # retries already handed to `new_retries`
        _SOURCES.add(self)
        # local shards and cache files whose SHA-256 matched: (path, dev, inode, size, mtime_ns)
        self._verified: set[tuple[str, int, int, int, int]] = set()

    def _fs(self) -> Any:
        return filesystem(self.url, self.storage_options)

    def _check_bucket(self, where: str) -> None:
        """Raise a clear ShardError when the bucket of this remote source does not exist."""
        bucket = self.url.split("://", 1)[1].split("/", 1)[0]
        try:
            call_remote(self._fs(), "ls", bucket, timeout=self.timeout)
        except FileNotFoundError as e:
            raise remote_error("read", where, self._fs(), e, self.timeout) from None
        except Exception:  # only a diagnosis: the caller's error stands
            return

    @property
    def retried(self) -> int:
        """Requests of this Source sent again after a transient failure (an error answer such
        as HTTP 500/503, a reset or dropped connection, a timeout), in this process: each time
        counted once, by the layer that sent it again: gpufeed (a whole read), botocore (an HTTP
        attempt) or aiohttp (a GET whose connection was reset, see `resends`). Not those of
        other Sources sharing the filesystem."""
        return self._retried + self._http_retried

    def new_retries(self) -> int:
        """Retries since the last call: also those made by read-ahead threads in between. A copy
        in another process (a forked worker) starts from none: those made before are the
        original's to report, once (they were counted once per worker)."""
        now = self.retried
        new, self._reported = now - self._reported, now
        return new

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        _SOURCES.add(self)
        _forked(self)  # a copy in another process (spawned, a Ray actor)

    def path(self, name: str) -> str:
        return f"{self.url}/{name}"

    def read_index(self) -> Index:
        """The data set's index (gpufeed-index.json, else a legacy index.json), with a clear
        ShardError when it is missing or unreadable."""
        last = self.url.rsplit("/", 1)[-1]
        hint = f"pass the directory `gpufeed pack` or `gpufeed index` wrote (holding {INDEX_NAME})"
        if last in (INDEX_NAME, LEGACY_INDEX_NAME):
            hint = f"pass its directory, {self.url.rsplit('/', 1)[0] or '/'}, instead"
        missing = (
            f"{self.path(INDEX_NAME)} not found: is {self.url} a directory written by "
            "`gpufeed pack` (or indexed with `gpufeed index`)?"
        )
        if last in (INDEX_NAME, LEGACY_INDEX_NAME):
            missing += f" ({hint})"
        for name in (INDEX_NAME, LEGACY_INDEX_NAME):
            where = self.path(name)
            try:
                if self.remote:
                    data = self._retry("read", where, "cat_file", where)
                else:
                    if os.path.exists(self.url) and not os.path.isdir(self.url):
                        raise ShardError(f"{self.url} is a file, not a data set directory: {hint}")
                    if os.path.exists(where) and not os.path.isfile(where):
                        raise ShardError(
                            f"cannot read {where}: it is not a regular file; re-create it with "
                            "`gpufeed pack`"
                        )
                    data = Path(where).read_bytes()
            except FileNotFoundError:
                if self.remote:
                    self._check_bucket(where)
                continue
            except PermissionError as e:  # a local file (a remote refusal is a ShardError)
                raise ShardError(
                    f"cannot read {where}: permission denied ({e}); check its permissions"
                ) from e
            except OSError as e:
                raise ShardError(f"cannot read {where}: {e}") from e
            return Index.from_bytes(data, where)
        raise ShardError(missing)

    def open(self, entry: ShardEntry, start: int = 0, end: int | None = None) -> BinaryIO:
        """A file-like over shard `entry` from byte `start`; a missing, unreadable or wrong-sized
        shard raises ShardError, and a reader opened at 0 and read to its end checks the SHA-256.
        A remote reader asks for nothing past byte `end` (the caller reads no further), unless
        it keeps a cache copy: that is the whole shard (see `finish`). Local readers read on
        demand and ignore `end`."""
        check_shard_name(entry.name)
        cached = self._cached(entry)
        if cached is not None:
            f = open(cached, "rb")  # noqa: SIM115 - handed to the caller
            f.seek(start)
            return f
        where = self.path(entry.name)
        if not self.remote:
            return self._open_local(entry, where, start)
        cache_to = None
        if self.cache_dir is not None and start == 0:
            cache_to = self._cache_path(entry)
            if cache_to is not None and cache_to.parent not in self._swept:
                self._swept.add(cache_to.parent)
                remove_partial_files(cache_to.parent)
        return io.BufferedReader(
            RangeReader(self, entry, start, cache_to=cache_to, end=end), buffer_size=256 * 1024
        )

    @staticmethod
    def finish(f: BinaryIO) -> None:
        """`f` (from `open`) was read as far as its caller needs. A reader that began at the
        shard's first byte and hashes it (a local shard not yet verified by this process, a
        remote one being cached) reads on to the shard's end: its SHA-256 is checked (a
        ChecksumError if it differs) and a remote copy is cached. A read that fails on the way
        only warns: what was delivered is good. Nothing for other readers."""
        raw = getattr(f, "raw", None)
        if not getattr(raw, "verifying", False):
            return
        try:
            while f.read(1 << 20):
                pass
        except ChecksumError:
            raise
        except Exception as e:
            warnings.warn(
                f"shard {visible(raw.entry.name)} not verified or cached: {visible(e)}",
                RuntimeWarning,
                stacklevel=2,
            )

    def _open_local(self, entry: ShardEntry, where: str, start: int) -> BinaryIO:
        root = os.path.abspath(self.url)
        if not os.path.abspath(where).startswith(os.path.join(root, "")):
            raise ShardError(f"shard {entry.name!r} is outside {self.url}; rejected")
        try:
            st = os.stat(where)
            if not stat.S_ISREG(st.st_mode):
                raise ShardError(
                    f"cannot read shard {where}: it is not a regular file (listed in the index)"
                )
            f = open(where, "rb", buffering=0)  # noqa: SIM115 - handed to the caller
        except FileNotFoundError:
            raise ShardError(f"shard {where} is missing (listed in the index)") from None
        except OSError as e:
            raise ShardError(
                f"cannot read shard {where}: {e.strerror or e}; check that it is a readable file"
            ) from e
        if st.st_size != entry.bytes:
            f.close()
            if st.st_size < entry.bytes:
                raise ShardError(
                    f"shard {where} is truncated: {st.st_size} bytes, the index says {entry.bytes}"
                )
            raise ShardError(
                f"shard {where} is {st.st_size} bytes, longer than the {entry.bytes} bytes "
                "the index says: it was changed after packing; re-create it with `gpufeed pack`"
            )
        key = (where, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        raw: io.RawIOBase = f
        if start == 0 and SHA256_HEX.fullmatch(entry.sha256) and key not in self._verified:
            raw = VerifyingReader(f, entry, where, lambda: self._verified.add(key))
        else:
            f.seek(start)
        return io.BufferedReader(raw, buffer_size=64 * 1024)

    def _cache_path(self, entry: ShardEntry) -> Path | None:
        """Where the cache keeps `entry`, always inside `cache_dir`; None for a shard without a
        checksum (its cache file could not be verified, so it is not cached)."""
        assert self.cache_dir is not None
        if not SHA256_HEX.fullmatch(entry.sha256):
            return None
        check_shard_name(entry.name)
        tag = hashlib.sha256(self.url.encode()).hexdigest()[:16]
        path = self.cache_dir / tag / f"{entry.sha256[:16]}-{entry.name}"
        root = self.cache_dir.resolve()
        if not path.parent.resolve().is_relative_to(root):
            raise ShardError(
                f"cache path {path} of shard {entry.name} resolves outside the cache directory "
                f"{self.cache_dir} (a symbolic link?); remove it or choose another cache_dir"
            )
        return path

    def _cached(self, entry: ShardEntry) -> Path | None:
        """The cache file of `entry` if it holds the shard: same size and SHA-256 (hashed once
        per process and file). A file that does not match is deleted, so the shard is fetched again."""
        if self.cache_dir is None or not self.remote:
            return None
        p = self._cache_path(entry)
        try:
            st = os.lstat(p) if p is not None else None
        except OSError:
            return None
        if p is None or st is None or not stat.S_ISREG(st.st_mode):
            return None
        key = (str(p), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if key in self._verified:
            return p
        if st.st_size != entry.bytes or sha256_file(str(p)) != entry.sha256:
            with contextlib.suppress(OSError):
                p.unlink()
            return None
        self._verified.add(key)
        return p

    def fetch_range(
        self, entry: ShardEntry, start: int, end: int, check_end: bool = False
    ) -> bytes:
        """Bytes [start, end) of a remote shard, retried with backoff; never short. With
        `check_end` (`end` is the shard's end) one byte more is asked for: getting it means the
        shard is longer than the index says, a ShardError."""
        fs = filesystem(self.url, self.storage_options)
        where = self.path(entry.name)

        def get(timeout: float) -> bytes:
            stop = end + 1 if check_end else end
            data = call_remote(fs, "cat_file", where, start=start, end=stop, timeout=timeout)
            if check_end and len(data) > end - start:
                size = int(call_remote(fs, "info", where, timeout=timeout).get("size", 0))
                raise ShardError(
                    f"shard {where} is {size} bytes, longer than the {entry.bytes} bytes "
                    "the index says: it was changed after packing; re-create it with "
                    "`gpufeed pack`"
                )
            if len(data) != end - start:
                info = call_remote(fs, "info", where, timeout=timeout)
                if int(info.get("size", 0)) < entry.bytes:
                    raise ShardError(
                        f"shard {where} is truncated: {info.get('size')} bytes, "
                        f"the index says {entry.bytes}"
                    )
                raise OSError(f"short read of {where} [{start}:{end}]: {len(data)} bytes")
            return data

        try:
            return self._retry("read", where, get)
        except FileNotFoundError:
            raise ShardError(f"shard {where} is missing (listed in the index)") from None

    def _retry(self, what: str, url: str, fn: Any, *args: Any) -> Any:
        """`fn(timeout)` (or `fs.fn(*args)` for a method name) retried with backoff while the
        error is transient, all within the deadline; FileNotFoundError passes through, any other
        failure (access denied included) is a ShardError naming `url` and the endpoint."""
        fs = filesystem(self.url, self.storage_options)
        if isinstance(fn, str):
            method, fn = fn, lambda timeout: call_remote(fs, method, *args, timeout=timeout)
        with hearing(self._count_http) as heard:
            out, self._reached, expired = retrying(
                fn, self.retries, self.backoff, self.timeout, self._reached, self._count
            )
        if isinstance(out, BaseException):
            if isinstance(out, (FileNotFoundError, ShardError)):
                raise out
            raise remote_error(what, url, fs, out, self.timeout, expired, heard.answer) from out
        return out

    def _count(self) -> None:
        self._retried += 1

    def _count_http(self) -> None:
        self._http_retried += 1  # only ever on fsspec's one I/O thread


def __getattr__(name: str) -> Any:
    """`CountingS3FileSystem` (see `storage`), made on first use: s3fs is imported only when S3
    is used."""
    if name == "CountingS3FileSystem":
        return _counting_s3_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
