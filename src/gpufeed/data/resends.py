"""HTTP requests that aiohttp sends again by itself, which botocore never sees as retries.

aiohttp re-sends an idempotent request (a GET, a HEAD) once, at once, on another connection
when its connection was reset or closed before the answer (RFC 9112, 9.3.1): a connection reset
by the endpoint, a proxy or a load balancer is retried there, below botocore's retry loop and its
`request-created` event. `count_resends` makes those re-sends seen, so that `Source.retried`
counts every request sent again after a failure, at whatever layer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def count_resends(client: Any, on_resend: Callable[[], None]) -> bool:
    """Call `on_resend()` (on the event loop, in the context of the request) each time aiohttp
    sends a request of the aiobotocore `client` again; False where the client's HTTP session is
    not aiohttp's (httpx re-sends nothing by itself) or is laid out otherwise."""
    http = getattr(getattr(client, "_endpoint", None), "http_session", None)
    get_session = getattr(http, "_get_session", None)
    if get_session is None or getattr(http, "_gpufeed_resends", False):
        return False
    trace = _trace_config(on_resend)

    async def traced_session(*args: Any, **kwargs: Any) -> Any:
        session = await get_session(*args, **kwargs)
        if trace not in session.trace_configs:
            session.trace_configs.append(trace)
        return session

    http._get_session = traced_session
    http._gpufeed_resends = True
    return True


def _trace_config(on_resend: Callable[[], None]) -> Any:
    """A TraceConfig that counts the connections each request gets: one per time it is sent
    (a redirect followed starts the count again: not a re-send)."""
    import aiohttp

    async def connected(_session: Any, ctx: Any, _params: Any) -> None:
        ctx.sends = getattr(ctx, "sends", 0) + 1
        if ctx.sends > 1:
            on_resend()

    async def redirected(_session: Any, ctx: Any, _params: Any) -> None:
        ctx.sends = 0

    trace = aiohttp.TraceConfig()
    trace.on_connection_create_end.append(connected)
    trace.on_connection_reuseconn.append(connected)
    trace.on_request_redirect.append(redirected)
    trace.freeze()
    return trace
