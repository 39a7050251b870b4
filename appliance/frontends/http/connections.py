"""HTTP connections that slow, silent or numerous clients cannot pin down.

aiohttp bounds header sizes and idle keep-alive time but has no timeout for a request that
arrives a byte at a time (slowloris), for a body that never comes, or for a client that stops
reading its response. Each connection here runs one periodic check for those three stalls,
and a listener refuses connections past its limit.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from appliance.settings import HttpConnectionLimits

log = logging.getLogger(__name__)

_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
_BUSY_BODY = b'{"error":"too many open HTTP connections"}'
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Type: application/json"
    b"\r\nContent-Length: %d\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY)
)


class GuardedRequestHandler(RequestHandler):
    """aiohttp's connection protocol with header, body and send stall timeouts."""

    def __init__(self, manager: web.Server, *, limits: HttpConnectionLimits, **kwargs: Any):
        super().__init__(manager, **kwargs)
        self._limits = limits
        timeouts = [t for t in (limits.header_timeout_secs, limits.body_timeout_secs) if t > 0]
        # Timeouts fire within a quarter of themselves: precise enough, one timer per connection.
        self._tick = max(0.05, min(timeouts) / 4) if timeouts else 0.0
        self._header_start: float | None = None
        self._handled = 0  # requests answered; all parsed ones answered: waiting for the next
        self._last_data = 0.0
        self._write_paused_at: float | None = None
        self._watch: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        manager = self._manager
        most = self._limits.max_connections
        if most and manager is not None and len(manager.connections) > most:
            log.debug("refusing an HTTP connection: %d open", len(manager.connections))
            self._close_with(_BUSY)
            return
        now = self._loop.time()
        self._header_start = now  # a client that connects must send its request in time
        self._last_data = now
        if self._tick:
            self._watch = self._loop.call_at(now + self._tick, self._check)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        now = self._loop.time()
        self._last_data = now
        if self._header_start is None and self._handled == self._request_count:
            self._header_start = now  # the first byte of the next request
        parsed = self._request_count
        super().data_received(data)
        if self._request_count != parsed:
            self._header_start = None

    async def _handle_request(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super()._handle_request(*args, **kwargs)
        finally:
            self._handled += 1

    def pause_writing(self) -> None:
        super().pause_writing()
        self._write_paused_at = self._loop.time()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._write_paused_at = None

    def _check(self) -> None:
        self._watch = None
        if self.transport is None or self._force_close:
            return
        now = self._loop.time()
        limits = self._limits
        header_start = self._header_start
        request = self._current_request
        if (
            header_start is not None
            and limits.header_timeout_secs > 0
            and now - header_start > limits.header_timeout_secs
        ):
            self._time_out("request headers", limits.header_timeout_secs, _TIMEOUT)
            return
        if limits.body_timeout_secs > 0:
            stalled = now - limits.body_timeout_secs
            if request is not None and not request.content.is_eof() and self._last_data < stalled:
                self._time_out("the request body", limits.body_timeout_secs, _TIMEOUT)
                return
            paused = self._write_paused_at
            if paused is not None and paused < stalled:
                self._time_out("the client to read its response", limits.body_timeout_secs)
                return
        self._watch = self._loop.call_at(now + self._tick, self._check)

    def _time_out(self, what: str, seconds: float, answer: bytes = b"") -> None:
        peer = self.transport.get_extra_info("peername") if self.transport else None
        log.info("closing HTTP connection from %s: waited %gs for %s", peer, seconds, what)
        self._close_with(answer)

    def _close_with(self, answer: bytes) -> None:
        transport = self.transport
        if transport is not None:
            if answer and not self._write_paused_at:
                transport.write(answer)  # sent before the close that force_close starts
            else:  # a client that does not read would keep a graceful close waiting
                transport.abort()
        self.force_close()


class GuardedServer(web.Server):
    """web.Server whose connections are GuardedRequestHandlers."""

    def __init__(self, plain: web.Server, limits: HttpConnectionLimits) -> None:
        super().__init__(
            plain.request_handler,
            request_factory=plain.request_factory,
            handler_cancellation=plain.handler_cancellation,
            loop=plain._loop,  # aiohttp keeps the loop and handler settings private
            **plain._kwargs,
        )
        self.limits = limits

    def __call__(self) -> RequestHandler:
        return GuardedRequestHandler(self, loop=self._loop, limits=self.limits, **self._kwargs)


class GuardedAppRunner(web.AppRunner):
    """AppRunner with header limits, keep-alive timeout and the guarded connections."""

    def __init__(self, app: web.Application, limits: HttpConnectionLimits, **kwargs: Any):
        super().__init__(
            app,
            keepalive_timeout=limits.keepalive_timeout_secs,
            max_line_size=limits.max_header_bytes,
            max_field_size=limits.max_header_bytes,
            max_headers=limits.max_headers,
            **kwargs,
        )
        self.limits = limits

    async def _make_server(self) -> web.Server:
        return GuardedServer(await super()._make_server(), self.limits)
