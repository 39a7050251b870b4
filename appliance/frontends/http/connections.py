"""HTTP connections that slow, silent or numerous clients cannot pin down.

aiohttp bounds header sizes and idle keep-alive time but has no timeout for a request that
arrives a byte at a time (slowloris), for a body that never comes, or for a client that stops
reading its response. Each connection here runs one periodic check for those three stalls,
and a listener refuses connections past its limit.

What this takes from aiohttp, and why: aiohttp has no public hook for bytes arriving on a
connection or for a transport pausing writes, so the guard subclasses its connection protocol,
`aiohttp.web_protocol.RequestHandler` (exported, undocumented): it overrides only the asyncio
protocol methods (`connection_made`, `connection_lost`, `data_received`, `pause_writing`,
`resume_writing`) and calls `force_close()`, and reads no private attribute. Requests are seen
through the documented low-level `web.Server(handler, request_factory=...)`. The one private
hook is `AppRunner._make_server`, the only place to hand an AppRunner its own `web.Server`.
tests/unit/test_http_connections.py pins all of it: it fails if aiohttp changes any of these.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http_parser import RawRequestMessage
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler

from appliance.common.settings import HttpConnectionLimits
from appliance.frontends.http.fastpath import InferConnection, InferRoute, stall
from appliance.frontends.http.relay import RelayHandler

log = logging.getLogger(__name__)

_BUSY_BODY = b'{"error":"too many open HTTP connections"}'
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Type: application/json"
    b"\r\nContent-Length: %d\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY)
)


class GuardedRequestHandler(RequestHandler):
    """aiohttp's connection protocol with header, body and send stall timeouts."""

    def __init__(
        self,
        server: GuardedServer,
        *,
        loop: asyncio.AbstractEventLoop,
        limits: HttpConnectionLimits,
        **kwargs: Any,
    ) -> None:
        super().__init__(server, loop=loop, **kwargs)
        self._guard_server = server
        self._guard_loop = loop
        self._limits = limits
        timeouts = [t for t in (limits.header_timeout_secs, limits.body_timeout_secs) if t > 0]
        # Timeouts fire within a quarter of themselves: precise enough, one timer per connection.
        self._tick = max(0.05, min(timeouts) / 4) if timeouts else 0.0
        self._header_start: float | None = None
        self._request: web.BaseRequest | None = None  # the one being handled
        self._last_data = 0.0
        self._write_paused_at: float | None = None
        self._watch: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        open_now = len(self._guard_server.connections)
        most = self._limits.max_connections
        if most and open_now > most:
            log.debug("refusing an HTTP connection: %d open", open_now)
            self._close_with(_BUSY)
            return
        now = self._guard_loop.time()
        self._header_start = now  # a client that connects must send its request in time
        self._last_data = now
        if self._tick:
            self._watch = self._guard_loop.call_at(now + self._tick, self._check)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        now = self._guard_loop.time()
        self._last_data = now
        if self._header_start is None and self._request is None:
            self._header_start = now  # the first byte of the next request
        super().data_received(data)

    def request_started(self, request: web.BaseRequest) -> None:
        """Its headers are in (called by GuardedServer's request factory)."""
        self._request = request
        self._header_start = None

    def request_finished(self) -> None:
        """Its handler returned (called by GuardedServer's handler wrapper)."""
        self._request = None

    def pause_writing(self) -> None:
        super().pause_writing()
        self._write_paused_at = self._guard_loop.time()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._write_paused_at = None

    def close_now(self) -> None:
        """Close at once, whatever is in progress (a shutdown past its deadline)."""
        self._close_with(b"")

    def _check(self) -> None:
        self._watch = None
        if self.transport is None:  # closed (force_close drops the transport)
            return
        now = self._guard_loop.time()
        request = self._request
        receiving = request is not None and not request.content.is_eof()
        late = stall(
            self._limits, now, self._header_start, receiving, self._last_data, self._write_paused_at
        )
        if late is not None:
            self._time_out(*late)
            return
        self._watch = self._guard_loop.call_at(now + self._tick, self._check)

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


_Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
_RequestFactory = Callable[
    [RawRequestMessage, StreamReader, RequestHandler, AbstractStreamWriter, "asyncio.Task[None]"],
    web.BaseRequest,
]


class GuardedServer(web.Server):
    """web.Server whose connections are GuardedRequestHandlers, told when requests start and
    finish; or, with an infer route, fastpath.InferConnections, which relay every other
    request to a RelayHandler of this server."""

    def __init__(
        self,
        handler: _Handler,
        request_factory: _RequestFactory,
        limits: HttpConnectionLimits,
        *,
        handler_cancellation: bool,
        infer_route: InferRoute | None = None,
        **handler_kwargs: Any,
    ) -> None:
        self._inner_handler = handler
        self._inner_factory = request_factory
        self._guard_loop = asyncio.get_running_loop()
        self._handler_kwargs = handler_kwargs
        self._infer_route = infer_route
        self.limits = limits
        self.fast_connections: set[InferConnection] = set()
        super().__init__(
            self._handle,
            request_factory=self._make_guarded_request,
            handler_cancellation=handler_cancellation,
            loop=self._guard_loop,
            **handler_kwargs,
        )

    def _make_guarded_request(
        self,
        message: RawRequestMessage,
        payload: StreamReader,
        protocol: RequestHandler,
        writer: AbstractStreamWriter,
        task: asyncio.Task[None],
    ) -> web.BaseRequest:
        request = self._inner_factory(message, payload, protocol, writer, task)
        if isinstance(protocol, GuardedRequestHandler):
            protocol.request_started(request)
        return request

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        protocol = request.protocol
        try:
            return await self._inner_handler(request)
        finally:
            if isinstance(protocol, GuardedRequestHandler):
                protocol.request_finished()

    # The protocol factory the sites listen with (aiohttp types it as its own protocol; asyncio
    # takes any).
    def __call__(self) -> asyncio.BaseProtocol:  # type: ignore[override]
        if self._infer_route is not None:
            return InferConnection(self, self._infer_route, self._guard_loop)
        return GuardedRequestHandler(
            self, loop=self._guard_loop, limits=self.limits, **self._handler_kwargs
        )

    def relay_handler(self, on_finished: Callable[[bool], None]) -> RelayHandler:
        """aiohttp's protocol for one request an InferConnection relays."""
        return RelayHandler(self, on_finished, loop=self._guard_loop, **self._handler_kwargs)

    def busy_connections(self) -> list[GuardedRequestHandler | InferConnection]:
        """The connections a shutdown past its deadline closes (`close_now`)."""
        plain = [c for c in self.connections if isinstance(c, GuardedRequestHandler)]
        return [*plain, *self.fast_connections]

    async def shutdown(self, timeout: float | None = None) -> None:
        fast = [connection.shutdown(timeout) for connection in list(self.fast_connections)]
        await asyncio.gather(super().shutdown(timeout), *fast)


class GuardedAppRunner(web.AppRunner):
    """AppRunner with header limits, keep-alive timeout and the guarded connections."""

    def __init__(
        self,
        app: web.Application,
        limits: HttpConnectionLimits,
        *,
        shutdown_timeout: float,
        handler_cancellation: bool = True,
        access_log: logging.Logger | None = None,
        infer_route: InferRoute | None = None,
    ) -> None:
        self._handler_kwargs: dict[str, Any] = {
            "keepalive_timeout": limits.keepalive_timeout_secs,
            "max_line_size": limits.max_header_bytes,
            "max_field_size": limits.max_header_bytes,
            "max_headers": limits.max_headers,
            "access_log": access_log,
        }
        super().__init__(
            app,
            handler_cancellation=handler_cancellation,
            shutdown_timeout=shutdown_timeout,
            **self._handler_kwargs,
        )
        self.limits = limits
        self._infer_route = infer_route

    async def _make_server(self) -> web.Server:
        # The plain server starts and freezes the app; the guarded one takes its handler and
        # request factory (public attributes) and makes the connections.
        plain = await super()._make_server()
        return GuardedServer(
            plain.request_handler,
            plain.request_factory,
            self.limits,
            handler_cancellation=plain.handler_cancellation,
            infer_route=self._infer_route,
            **self._handler_kwargs,
        )
