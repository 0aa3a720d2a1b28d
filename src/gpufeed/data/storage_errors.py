"""What a failed remote call means: whether to try it again (`retrying`, within the deadline,
with backoff) and, if not, one ShardError that says why, naming the URL and the endpoint.

Missing buckets or keys, refused access, missing credentials and options the filesystem does not
take are not retried, nor is an endpoint that cannot be reached before it ever answered; once it
has answered, an outage is retried until the deadline (then its last answer, such as 503
SlowDown, is reported). botocore is never imported here: its errors are told apart by class name
and by the response they carry.
"""

from __future__ import annotations

import random
import socket
import time
from typing import Any
from urllib.parse import urlsplit

from gpufeed.data.shards import ShardError

MAX_PAUSE = 4.0  # seconds: the longest backoff between two tries of one remote operation


def endpoint_of(fs: Any, url: str = "") -> str:
    """The endpoint a remote filesystem talks to, for error messages: an S3 filesystem's (AWS S3
    when none is set), else the scheme and host of `url` (http://HOST:PORT)."""
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    if "s3" in protocols:
        client = getattr(fs, "client_kwargs", None) or {}
        return str(getattr(fs, "endpoint_url", None) or client.get("endpoint_url") or "AWS S3")
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.netloc else f"{parts.scheme or '?'}://"


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
    return answer_of(_response(exc))


def answer_of(response: Any) -> str:
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
    `heard`: the last error the endpoint answered inside botocore's own retries (see
    `storage.hearing`)."""
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


def retrying(
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
