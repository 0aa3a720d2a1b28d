"""The fsspec filesystem a remote data set is read from or written to, and its options.

Every remote operation has a deadline, `storage_options={"timeout": SECONDS}` (default 120 s,
retries included; the key is gpufeed's, not passed to s3fs), and connect/read timeouts per HTTP
attempt (10 s / 30 s, capped by the deadline; s3fs's `config_kwargs` override them). An S3
filesystem retries inside botocore only (3 attempts, counted in its `retried`), never in s3fs's own
loop; the call that made the requests hears of those retries and of the endpoint's last error
answer (`hearing`). s3fs is imported only when S3 is used.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any

from gpufeed.data.resends import count_resends
from gpufeed.data.shards import ShardError
from gpufeed.data.storage_errors import answer_of
from gpufeed.errors import OptionError
from gpufeed.extras import require

DEFAULT_TIMEOUT = 120.0  # seconds: the overall deadline of one remote operation, retries included
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


class Heard:
    """What botocore saw of one call's HTTP requests: its retries (counted by `on_retry`) and
    the last error the endpoint answered ('' if none), which botocore's own retries would
    otherwise hide behind a deadline."""

    def __init__(self, on_retry: Callable[[], None]) -> None:
        self.on_retry, self.answer = on_retry, ""


# the call whose requests are made in this context (several Sources share one filesystem);
# asyncio runs a call's coroutine in a copy of its caller's context
_HTTP_CALL: ContextVar[Heard | None] = ContextVar("gpufeed_http_call", default=None)


@contextlib.contextmanager
def hearing(on_retry: Callable[[], None]) -> Iterator[Heard]:
    """What botocore sees of the requests made inside the block (see `Heard`)."""
    heard = Heard(on_retry)
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
                    call.answer = answer_of(response[1]) or call.answer

        CountingS3FileSystem.__qualname__ = "CountingS3FileSystem"  # picklable: see __getattr__
        _COUNTING_S3 = CountingS3FileSystem
    return _COUNTING_S3


def __getattr__(name: str) -> Any:
    """`CountingS3FileSystem`, made on first use (s3fs is imported only when S3 is used)."""
    if name == "CountingS3FileSystem":
        return _counting_s3_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def call_remote(fs: Any, method: str, *args: Any, timeout: float, **kwargs: Any) -> Any:
    """`fs.method(*args, **kwargs)` that gives up after `timeout` seconds (an FSTimeoutError)."""
    coro = getattr(fs, f"_{method}", None)
    if getattr(fs, "async_impl", False) and coro is not None:
        from fsspec.asyn import sync

        return sync(fs.loop, coro, *args, timeout=max(timeout, 0.01), **kwargs)
    return getattr(fs, method)(*args, **kwargs)
