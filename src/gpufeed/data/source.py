"""Where shards live: a local directory or `s3://bucket/prefix` (any S3-compatible store, via fsspec).

Remote shards are streamed ("pipe mode") as ranged GETs of `chunk_size` bytes with a read-ahead
thread, so training starts before a shard, let alone the data set, is downloaded. Each chunk is an
idempotent range request retried with exponential backoff, so a retry can never deliver a byte
twice or skip one. A reader asks for nothing past the samples its caller reads (a worker's run of
an unshuffled epoch is one batch). With `cache_dir`, a shard read from its start is read on to its
end (`Source.finish`), verified against its index checksum and kept on local disk for later
epochs and runs. Without `cache_dir`, a remote shard whose runs several workers read (an
unshuffled epoch) is not hashed: reading it whole for that would double what is downloaded.

What the index (gpufeed-index.json) promises is checked on read. Every shard's size: a local one
when it is opened, a remote one when its last chunk is fetched (one byte more is asked for). Its
SHA-256 whenever a shard is read from its first byte to its end (the reader hashes as it goes; a
mismatch is a ShardError at the end of the shard, after its other samples were delivered: the index
has no per-sample checksums). A local shard or cache file found intact is not hashed again by the
same process while its size, inode and mtime stay the same. Cache files are only ever written inside
`cache_dir` under names made of the index's checksum (64 hex digits, checked when the index is
read), and a cache file is used only after its SHA-256 matched: a planted or damaged one is deleted
and the shard fetched again. A cache file being written is named after its writer (PID and host):
one left behind by a killed writer is deleted when the cache is next used.

Every remote operation has a deadline, `storage_options={"timeout": SECONDS}` (default 120 s,
retries included; the key is gpufeed's, not passed to s3fs), and connect/read timeouts per HTTP
attempt (10 s / 30 s, capped by the deadline; s3fs's `config_kwargs` override them). Retries
happen in botocore (3 attempts, counted in `retried`) and here (whole requests, with backoff),
never in s3fs's own loop. Missing buckets or keys, refused access, missing credentials and options
the filesystem does not take are not retried, nor is an endpoint that cannot be reached before it
ever answered; once it has answered, an outage is retried until the deadline (then its last answer,
such as 503 SlowDown, is reported). Every failure is one ShardError naming the URL and the
endpoint.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import random
import re
import socket
import stat
import tempfile
import time
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import ContextVar
from pathlib import Path
from typing import Any, BinaryIO

from gpufeed.atomic import write_atomic
from gpufeed.data.partials import (
    pack_tmp,
    partial_prefix,
    remove_partial_files,
    remove_stale_pack_tmp,
)
from gpufeed.data.partials import writer_host as _writer_host  # noqa: F401 - its old home
from gpufeed.data.resends import count_resends
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
from gpufeed.errors import OptionError
from gpufeed.extras import require
from gpufeed.text import visible

MB = 1 << 20


def is_remote(url: str) -> bool:
    """True for URLs fsspec should open (s3://, gs://, ...), false for local paths."""
    return "://" in str(url) and not str(url).startswith("file://")


# `s3:/bucket/x`, `s3:bucket/x`: a remote scheme without its `//`, which would name a local folder
_MISTYPED_URL = re.compile(r"(s3a?|gs|gcs|az|abfss?|https?):/?(?!/)[^/]*", re.IGNORECASE)


def base_url(url: str | os.PathLike[str]) -> str:
    """`url` without trailing slashes (and `~` expanded); a ShardError for a remote URL that
    names no bucket (`s3://`, `s3:///prefix`), which would otherwise be taken for a local folder
    `s3:`."""
    text = str(url)
    if not is_remote(text):
        typo = _MISTYPED_URL.match(text)
        if typo and not os.path.exists(typo[0].rstrip("/")):
            scheme, rest = text.split(":", 1)
            raise ShardError(
                f"{text} looks like a mistyped URL (one slash or none after '{scheme}:'): write "
                f"{scheme.lower()}://{rest.lstrip('/')}, or ./{text} for a local folder"
            )
        return os.path.expanduser(text).rstrip("/")
    scheme, rest = text.split("://", 1)
    rest = rest.rstrip("/")
    if not rest.split("/", 1)[0]:
        raise ShardError(
            f"{text} names no bucket: give {scheme}://BUCKET or {scheme}://BUCKET/PREFIX"
        )
    return f"{scheme}://{rest}"


DEFAULT_TIMEOUT = 120.0  # seconds: the overall deadline of one remote operation, retries included
MAX_PAUSE = 4.0  # seconds: the longest backoff between two tries of one remote operation
CONNECT_TIMEOUT, READ_TIMEOUT = 10.0, 30.0  # per HTTP attempt, each capped by the deadline


_DICT_OPTIONS = {  # storage_options keys that must be dicts, with an example value
    "client_kwargs": "{'endpoint_url': 'http://HOST:PORT'}",
    "config_kwargs": "{'read_timeout': 60}",
}


def check_storage_options(storage_options: Any) -> dict[str, Any] | None:
    """`storage_options` if it can be handed to the filesystem: None, or a dict whose
    `client_kwargs` and `config_kwargs` (where given) are dicts; else an OptionError naming it
    (such a value failed deep inside s3fs or botocore, at the first read)."""
    if storage_options is None:
        return None
    if not isinstance(storage_options, Mapping):  # a dict, or a config's (OmegaConf's DictConfig)
        raise OptionError(
            f"storage_options={storage_options!r}: give a dict of the filesystem's options, "
            "e.g. {'timeout': 60, 'anon': True} (s3fs.S3FileSystem's for s3://)"
        )
    storage_options = dict(storage_options)
    for key, example in _DICT_OPTIONS.items():
        value = storage_options.get(key)
        if value is not None and not isinstance(value, Mapping):
            raise OptionError(
                f"storage_options {key}={value!r}: give a dict, e.g. {{'{key}': {example}}}"
            )
        if value is not None:
            storage_options[key] = dict(value)
    return storage_options


def s3_options(storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """s3fs options: the endpoint from AWS_ENDPOINT_URL(_S3) unless given; credentials are s3fs's;
    connect/read timeouts (10 s / 30 s, capped by the deadline) and at most 3 HTTP attempts per
    request unless `config_kwargs` says otherwise. The deadline key `timeout` is not s3fs's."""
    opts = dict(check_storage_options(storage_options) or {})
    deadline = remote_timeout(opts)
    opts.pop("timeout", None)
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint and "endpoint_url" not in opts:
        client = dict(opts.get("client_kwargs") or {})
        client.setdefault("endpoint_url", endpoint)
        opts["client_kwargs"] = client
    config = dict(opts.get("config_kwargs") or {})
    config.setdefault("connect_timeout", min(CONNECT_TIMEOUT, deadline))
    config.setdefault("read_timeout", min(READ_TIMEOUT, deadline))
    config.setdefault("retries", {"max_attempts": 3, "mode": "standard"})
    opts["config_kwargs"] = config
    return opts


def remote_timeout(storage_options: dict[str, Any] | None) -> float:
    """The overall deadline in seconds of one remote operation: `storage_options["timeout"]`."""
    value = (check_storage_options(storage_options) or {}).get("timeout", DEFAULT_TIMEOUT)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e6:
        raise ShardError(
            f"storage_options timeout={value!r}: give the seconds one remote read or write may "
            f"take, retries included, e.g. {{'timeout': 60}} (default {DEFAULT_TIMEOUT:g})"
        )
    return float(value)


_FS_CACHE: dict[tuple[int, str, str], Any] = {}


def filesystem(url: str, storage_options: dict[str, Any] | None = None) -> Any:
    """One fsspec filesystem per process, options and AWS_* environment (fsspec objects must not
    cross a fork; a changed environment may mean other credentials or endpoint).
    An S3 one retries inside botocore only (counted in its `retried`), never again in s3fs."""
    import fsspec

    protocol = str(url).split("://", 1)[0]
    if protocol in ("s3", "s3a"):
        require("s3")
        opts = s3_options(storage_options)
    else:
        opts = {k: v for k, v in (storage_options or {}).items() if k != "timeout"}
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_"))  # credentials
    key = (os.getpid(), protocol, repr((sorted(opts.items()), env)))
    if key not in _FS_CACHE:
        if protocol in ("s3", "s3a"):
            _FS_CACHE[key] = _counting_s3_class()(skip_instance_cache=True, **opts)
        else:
            try:
                _FS_CACHE[key] = fsspec.filesystem(protocol, skip_instance_cache=True, **opts)
            except (ValueError, ImportError) as e:  # an unknown scheme, or its package missing
                raise ShardError(
                    f"cannot open {url}: {e}; use a local path or s3://BUCKET/KEY"
                ) from None
    return _FS_CACHE[key]


_COUNTING_S3: Any = None


class _Heard:
    """What botocore saw of one call's HTTP requests: its retries (counted by `on_retry`) and
    the last error the endpoint answered ('' if none), which botocore's own retries would
    otherwise hide behind a deadline."""

    def __init__(self, on_retry: Callable[[], None]) -> None:
        self.on_retry, self.answer = on_retry, ""


# the call whose requests are made in this context (several Sources share one filesystem);
# asyncio runs a call's coroutine in a copy of its caller's context
_HTTP_CALL: ContextVar[_Heard | None] = ContextVar("gpufeed_http_call", default=None)


@contextlib.contextmanager
def _hearing(on_retry: Callable[[], None]) -> Iterator[_Heard]:
    """What botocore sees of the requests made inside the block (see `_Heard`)."""
    heard = _Heard(on_retry)
    token = _HTTP_CALL.set(heard)
    try:
        yield heard
    finally:
        _HTTP_CALL.reset(token)


def _counting_s3_class() -> Any:
    """S3FileSystem that counts the HTTP retries botocore makes (its `retried` attribute) and
    tells the call that made them (see `_HTTP_CALL`) of them and of the endpoint's answers."""
    global _COUNTING_S3
    if _COUNTING_S3 is None:
        from s3fs import S3FileSystem

        class CountingS3FileSystem(S3FileSystem):  # type: ignore[misc]
            retried = 0
            retries = 1  # no retry loop in s3fs: it would retry even missing credentials

            async def set_session(self, refresh: bool = False, kwargs: Any = None) -> Any:
                s3 = await super().set_session(refresh)
                if not getattr(s3, "_gpufeed_counted", False):
                    s3.meta.events.register("request-created.s3", self._count_retry)
                    s3.meta.events.register("needs-retry.s3", self._hear_answer)
                    count_resends(s3, self._retry_made)  # aiohttp's own, below botocore
                    s3._gpufeed_counted = True
                return s3

            def _count_retry(self, request: Any, **_: Any) -> None:
                if (request.context.get("retries") or {}).get("attempt", 1) > 1:
                    self._retry_made()

            def _retry_made(self) -> None:
                self.retried += 1
                call = _HTTP_CALL.get()
                if call is not None:
                    call.on_retry()

            def _hear_answer(self, response: Any = None, **_: Any) -> None:
                # response: (http response, parsed) when the endpoint answered at all
                call = _HTTP_CALL.get()
                if call is not None and isinstance(response, tuple) and len(response) == 2:
                    call.answer = _answer_of(response[1]) or call.answer

        CountingS3FileSystem.__qualname__ = "CountingS3FileSystem"  # picklable: see __getattr__
        _COUNTING_S3 = CountingS3FileSystem
    return _COUNTING_S3


def __getattr__(name: str) -> Any:
    """`CountingS3FileSystem`, made on first use (s3fs is imported only when S3 is used)."""
    if name == "CountingS3FileSystem":
        return _counting_s3_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def endpoint_of(fs: Any, url: str = "") -> str:
    """The endpoint a remote filesystem talks to, for error messages: an S3 filesystem's (AWS S3
    when none is set), else the scheme and host of `url` (http://HOST:PORT)."""
    from urllib.parse import urlsplit

    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    if "s3" in protocols:
        client = getattr(fs, "client_kwargs", None) or {}
        return str(getattr(fs, "endpoint_url", None) or client.get("endpoint_url") or "AWS S3")
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.netloc else f"{parts.scheme or '?'}://"


def call_remote(fs: Any, method: str, *args: Any, timeout: float, **kwargs: Any) -> Any:
    """`fs.method(*args, **kwargs)` that gives up after `timeout` seconds (an FSTimeoutError)."""
    coro = getattr(fs, f"_{method}", None)
    if getattr(fs, "async_impl", False) and coro is not None:
        from fsspec.asyn import sync

        return sync(fs.loop, coro, *args, timeout=max(timeout, 0.01), **kwargs)
    return getattr(fs, method)(*args, **kwargs)


_CREDENTIALS = frozenset({"NoCredentialsError", "PartialCredentialsError", "NoRegionError"})
_UNREACHABLE = frozenset({"EndpointConnectionError", "ConnectTimeoutError", "ProxyConnectionError"})
_TIMEOUTS = frozenset({"FSTimeoutError", "TimeoutError", "ReadTimeoutError", "ConnectTimeoutError"})


def _names(exc: BaseException) -> set[str]:
    return {c.__name__ for c in type(exc).__mro__}


def _transient(exc: BaseException, reached: bool) -> bool:
    """Worth retrying: not a missing file, a refusal, bad credentials, options the filesystem
    does not take (TypeError, AttributeError) or our own verdict; an endpoint that cannot be
    reached only after it once answered (a restart, not a typo)."""
    final = (FileNotFoundError, PermissionError, ShardError, ValueError, TypeError, AttributeError)
    if isinstance(exc, final) or _status(exc) == 400:  # a bad request is bad every time
        return False
    names = _names(exc)
    if names & _CREDENTIALS:
        return False
    return reached or not names & _UNREACHABLE


def _refused(endpoint: str) -> str:
    """Why a TCP connection to `endpoint` fails right now ('' when it connects): tells a dead
    endpoint from a silent one after a deadline passed."""
    from urllib.parse import urlsplit

    parts = urlsplit(endpoint)
    if not parts.hostname:
        return ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=2).close()
    except OSError as e:
        return e.strerror or str(e)
    return ""


def _response(exc: BaseException) -> dict[str, Any] | None:
    """The response of the botocore error behind `exc` (itself or its cause), or None."""
    for e in (exc, exc.__cause__):
        response = getattr(e, "response", None)
        if isinstance(response, dict) and isinstance(response.get("Error"), dict):
            return response
    return None


def _status(exc: BaseException) -> int | None:
    """The HTTP status of the botocore error behind `exc` (None if none)."""
    status = (_response(exc) or {}).get("ResponseMetadata", {}).get("HTTPStatusCode")
    return status if isinstance(status, int) else None


def _answer(exc: BaseException) -> str:
    """What the endpoint answered to a failed request, e.g. '503 SlowDown (throttled)': the
    HTTP status and S3 error code of the botocore error behind `exc` ('' if none)."""
    return _answer_of(_response(exc))


def _answer_of(response: Any) -> str:
    """'STATUS CODE (why)' of a botocore error response ('' for none, or for a success)."""
    if not isinstance(response, dict) or not isinstance(response.get("Error"), dict):
        return ""
    status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode", "")
    code = response["Error"].get("Code", "")
    hint = " (throttled)" if code == "SlowDown" else ""
    hint = hint or (" (a server error)" if str(status).startswith("5") else "")
    answer = str(code) if str(code) == str(status) else f"{status} {code}"  # HEAD: no code
    return answer.strip() + hint


def remote_error(
    what: str,
    url: str,
    fs: Any,
    exc: BaseException,
    deadline: float,
    expired: bool = False,
    heard: str = "",
) -> ShardError:
    """One clear ShardError for a failed remote operation, naming the URL and the endpoint;
    `expired`: `exc` is the last answer of an endpoint still failing when the deadline passed;
    `heard`: the last error the endpoint answered inside botocore's own retries (see `_Heard`)."""
    endpoint = endpoint_of(fs, url)
    names = _names(exc)
    if isinstance(exc, FileNotFoundError) and "bucket" in str(exc).lower():
        why = "the bucket does not exist; create it or fix the URL"
    elif isinstance(exc, FileNotFoundError) and (refused := _refused(endpoint)):
        why = f"cannot connect ({refused}); check the URL's host and port and that it is up"
    elif isinstance(exc, FileNotFoundError):
        why = "not found; check the URL"
    elif isinstance(exc, PermissionError):
        why = (
            f"access denied ({_answer(exc) or exc}); check the credentials (expired?) and their "
            "permissions on this bucket"
        )
    elif _status(exc) == 400:  # s3fs: OSError(EINVAL, 'Bad Request'); a HEAD has no code
        why = (
            f"bad request ({_answer(exc) or exc}): most often expired credentials (a session "
            "token: ExpiredToken) or a wrong region; renew the credentials, check AWS_REGION"
        )
    elif names & _CREDENTIALS:
        why = (
            f"no usable credentials ({type(exc).__name__}); set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or pass key/secret in storage_options"
        )
    elif names & _UNREACHABLE:
        detail = _refused(endpoint) or type(exc).__name__
        why = f"cannot connect ({detail}); check the endpoint (AWS_ENDPOINT_URL) and that it is up"
    elif names & _TIMEOUTS and (refused := _refused(endpoint)):
        why = f"cannot connect ({refused}); check the endpoint (AWS_ENDPOINT_URL) and that it is up"
    elif names & _TIMEOUTS and expired and heard:  # botocore was still retrying its answers
        why = (
            f"still failing at the {deadline:g} s deadline (last answer: {heard}); retry later, "
            "or allow more time with storage_options={'timeout': SECONDS} (`--timeout SECONDS` "
            "on the command line)"
        )
    elif names & _TIMEOUTS:
        why = (
            f"no answer within {deadline:g} s; check that the endpoint is up, or allow more time "
            "with storage_options={'timeout': SECONDS} (`--timeout SECONDS` on the command line)"
        )
    elif isinstance(exc, (TypeError, AttributeError)):
        why = (
            f"the filesystem does not take these storage_options ({type(exc).__name__}: {exc}); "
            "pass only its options (s3fs.S3FileSystem's for s3://) and 'timeout'"
        )
    elif expired:
        last = _answer(exc) or f"{type(exc).__name__}: {exc}"
        why = (
            f"still failing at the {deadline:g} s deadline (last answer: {last}); retry later, "
            "or allow more time with storage_options={'timeout': SECONDS} (`--timeout SECONDS` "
            "on the command line)"
        )
    else:
        why = f"{type(exc).__name__}: {exc}"
    at = "" if url.startswith(endpoint) else f" at {endpoint}"
    return ShardError(f"cannot {what} {url}{at}: {why}")


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
        chunk_size: int = 8 * MB,
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
        with _hearing(self._count_http) as heard:
            out, self._reached, expired = _retrying(
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


def _retrying(
    fn: Any, retries: int, backoff: float, deadline: float, reached: bool, on_retry: Any
) -> tuple[Any, bool, bool]:
    """(result or the error to report, whether the endpoint answered, whether the deadline
    passed): `fn(seconds left)` tried while its error is transient and the deadline has not
    passed: up to `retries + 1` times, or, once the endpoint has answered (an outage, not a
    wrong address), until the deadline, with pauses growing to at most `MAX_PAUSE` seconds. At
    the deadline the error reported is the last one that was not a timeout (the deadline cuts
    the last try short: an endpoint answering 503 would look silent)."""
    stop = time.monotonic() + deadline
    attempt = 0
    answered: Exception | None = None
    while True:
        try:
            return fn(stop - time.monotonic()), True, False
        except Exception as e:
            if not _names(e) & _TIMEOUTS:
                answered = e
            if not _transient(e, reached) or (attempt >= retries and not reached):
                return e, reached, False
            pause = min(MAX_PAUSE, backoff * (2**attempt)) * (0.5 + random.random())
            if time.monotonic() + pause >= stop:
                return answered or e, reached, True
            on_retry()
            time.sleep(pause)
            attempt += 1


class ChecksumError(ShardError):
    """A shard's bytes do not have the SHA-256 its index records."""


def _mismatch(where: str, got: str, want: str) -> ChecksumError:
    return ChecksumError(
        f"shard {where}: its SHA-256 is {got}, the index says {want}: the shard was changed "
        "after packing or is corrupt; re-create it with `gpufeed pack` or restore it"
    )


class VerifyingReader(io.RawIOBase):
    """A local shard read from its first byte: hashes what is read and, at its end, checks the
    SHA-256 against the index (a ShardError if it differs; `verified()` if it matches)."""

    def __init__(self, f: io.FileIO, entry: ShardEntry, where: str, verified: Any) -> None:
        self._f, self.entry, self.where, self._verified = f, entry, where, verified
        self._hash: Any = hashlib.sha256()

    def readable(self) -> bool:
        return True

    @property
    def verifying(self) -> bool:
        """Reading on to the shard's end checks its SHA-256 (see `Source.finish`)."""
        return self._hash is not None

    def readinto(self, b: Any) -> int:
        n = self._f.readinto(b)
        if n:
            if self._hash is not None:
                self._hash.update(memoryview(b)[:n])
        elif self._hash is not None:
            got, self._hash = self._hash.hexdigest(), None
            if got != self.entry.sha256:
                raise _mismatch(self.where, got, self.entry.sha256)
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
        source: Source,
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


class Destination:
    """Where `pack` writes: atomic whole-file writes to a local directory or a remote prefix.
    Remote operations have the same deadline, retries and clear errors (ShardError) as `Source`."""

    def __init__(self, url: str | os.PathLike[str], storage_options: dict[str, Any] | None = None):
        self.url = base_url(url)
        self.remote = is_remote(self.url)
        self.storage_options = check_storage_options(storage_options)
        self.timeout = remote_timeout(storage_options) if self.remote else DEFAULT_TIMEOUT
        self._reached = False
        if not self.remote:
            try:
                Path(self.url).mkdir(parents=True, exist_ok=True)
            except OSError as e:
                what = "it is a file" if isinstance(e, FileExistsError) else e.strerror or str(e)
                raise ShardError(
                    f"cannot write to {self.url}: {what}; give a writable folder (created if "
                    "missing) or s3://bucket/prefix"
                ) from None

    def path(self, name: str) -> str:
        return f"{self.url}/{name}"

    def _fs(self) -> Any:
        return filesystem(self.url, self.storage_options)

    def _remote(self, what: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """`fs.method(*args, **kwargs)` with retries within the deadline; failures are one
        ShardError."""
        fs = self._fs()
        with _hearing(lambda: None) as heard:
            out, self._reached, expired = _retrying(
                lambda timeout: call_remote(fs, method, *args, timeout=timeout, **kwargs),
                retries=4,
                backoff=0.1,
                deadline=self.timeout,
                reached=self._reached,
                on_retry=lambda: None,
            )
        if isinstance(out, BaseException):
            named = args and str(args[0]).startswith(f"{self.url}/")  # a file, not the bucket
            where = str(args[0]) if named else self.url
            raise remote_error(what, where, fs, out, self.timeout, expired, heard.answer) from out
        return out

    def check(self) -> None:
        """Fail early, with a clear ShardError, when a remote destination cannot be written
        (missing bucket, no credentials, unreachable endpoint); nothing is written."""
        if self.remote:
            bucket = self.url.split("://", 1)[1].split("/", 1)[0]
            self._remote("write to", "ls", bucket)

    def exists(self, name: str) -> bool:
        if self.remote:
            return bool(self._remote("write to", "exists", self.path(name)))
        return Path(self.path(name)).exists()

    def read_bytes(self, name: str) -> bytes:
        if self.remote:
            return self._remote("read", "cat_file", self.path(name))  # type: ignore[no-any-return]
        return Path(self.path(name)).read_bytes()

    def size(self, name: str) -> int:
        if self.remote:
            return int(self._remote("read", "info", self.path(name))["size"])
        return os.path.getsize(self.path(name))

    def sizes(self) -> dict[str, int]:
        """{name: bytes} of the files directly in the destination (one listing, also remote)."""
        if self.remote:
            listed = self._remote("read", "ls", self.url, detail=True, refresh=True)
            return {
                str(f["name"]).rstrip("/").rsplit("/", 1)[-1]: int(f.get("size") or 0)
                for f in listed
                if f.get("type") == "file"
            }
        with os.scandir(self.url) as entries:
            return {e.name: e.stat().st_size for e in entries if e.is_file()}

    def write_bytes(self, name: str, data: bytes) -> None:
        """Write atomically: a temporary name then a rename (an S3 PUT is atomic by itself)."""
        if self.remote:
            self._remote("write to", "pipe_file", self.path(name), data)
            return
        write_atomic(self.path(name), data, tmp=self.local_tmp(name), fsync=True)

    def put_file(self, local: str, name: str) -> None:
        """Move a finished local file into place atomically (the local file is gone after,
        also when the upload failed)."""
        if self.remote:
            try:
                self._remote("write to", "put_file", local, self.path(name))
            finally:
                os.unlink(local)
        else:
            os.replace(local, self.path(name))

    def remove(self, name: str) -> None:
        """Delete `name` if it is there."""
        if not self.remote:
            Path(self.path(name)).unlink(missing_ok=True)
        elif self.exists(name):
            self._remote("write to", "rm_file", self.path(name))

    def local_tmp(self, name: str) -> str:
        """A temporary local path for building `name` (inside DST when it is local, so the rename is atomic)."""
        if self.remote:  # named after this process and DST: see `remove_stale_tmp`
            return pack_tmp(self.url, name)
        return f"{self.path(name)}.tmp-{os.getpid()}"

    def remove_stale_tmp(self, own: re.Pattern[str]) -> int:
        """Delete the temporary files (`local_tmp`) of the files `own` names that a previous,
        interrupted writer left behind; never another file (a user's `results.tmp-2024`), nor,
        for a remote DST (files in $TMPDIR), those of a live pack. Returns how many."""
        if self.remote:
            return remove_stale_pack_tmp(self.url, own)
        tmp = re.compile(rf"(?:{own.pattern})\.tmp-\d+")
        stale = [p for p in Path(self.url).glob("*.tmp-*") if tmp.fullmatch(p.name)]
        for p in stale:
            p.unlink(missing_ok=True)
        return len(stale)
