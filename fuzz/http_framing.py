"""The HTTP framing target: raw bytes into the fast path's connection (frontends/http/fastpath.py
InferConnection, httptools' parser), on a transport that only records what is written. No
sockets: the bytes arrive in the pieces the input chooses, the event loop runs between them,
and every request the connection relays goes to a real aiohttp protocol (RelayHandler of a
GuardedServer) whose route reads the body, so that gzip and deflate bodies are inflated by
aiohttp's decoder under its size limit (the server's only unpacking of compressed data).

A finding is an exception out of the connection, an error logged by it or by aiohttp (the
connection logs its own bugs as "HTTP request handling failed" and answers 500), or a 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web

from appliance.common.errors import ApplianceError
from appliance.common.limits import RequestLimits
from appliance.common.settings import HttpConnectionLimits
from appliance.frontends.http.codec import decode_request
from appliance.frontends.http.connections import GuardedAppRunner, GuardedServer
from appliance.frontends.http.fastpath import Body, InferConnection, Reply
from appliance.frontends.http.server import _guard
from appliance.frontends.status import HTTP_STATUS
from appliance.ops import logs
from appliance.services.shared_memory import SharedMemoryRegistry

# No timers: a run is a few loop steps, and a timeout would make runs depend on the clock.
LIMITS = HttpConnectionLimits(
    max_header_bytes=512,
    max_headers=16,
    header_timeout_secs=0,
    body_timeout_secs=0,
    keepalive_timeout_secs=0,
    max_connections=0,
)
MAX_BODY_BYTES = 4096


class Route:
    """The infer route: the real codec decodes the body (JSON or binary); errors are answered
    with their status, as the front end's route does."""

    max_body_bytes = MAX_BODY_BYTES

    def __init__(self) -> None:
        self.shm = SharedMemoryRegistry()
        self.limits = RequestLimits()

    def admit(self, model: str, version: str, headers: Mapping[str, str]) -> Any:
        if model == "refused":
            return self.error(503, "overloaded")
        return object()

    def infer_reply(
        self,
        model: str,
        version: str,
        admission: Any,
        body: Body,
        headers: Mapping[str, str],
        raw_headers: Sequence[tuple[bytes, bytes]],
    ) -> Reply:
        try:
            decoded = decode_request(
                body,
                headers.get("inference-header-content-length"),
                model,
                version,
                self.shm,
                self.limits,
            )
        except ApplianceError as exc:
            return self.error(HTTP_STATUS[exc.code], exc.message)
        return Reply(200, b"application/json", [b'{"id":"%s"}' % decoded.request.id.encode()])

    @staticmethod
    def error(status: int, message: str) -> Reply:
        return Reply(status, b"application/json", [b'{"error":"x"}'])


class Transport(asyncio.Transport):
    """Records writes; close() ends the connection on the next loop step, as a socket's does."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.loop = loop
        self.written: list[bytes] = []
        self.closed = False
        self.protocol: InferConnection | None = None
        self.reading = True

    def write(self, data: Any) -> None:
        if self.closed:
            raise AssertionError("write after close")
        self.written.append(bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.protocol is not None:
                self.loop.call_soon(self.protocol.connection_lost, None)

    def abort(self) -> None:
        self.close()

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_reading(self) -> bool:
        return self.reading


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def _relayed(request: web.Request) -> web.Response:
    body = await request.read()  # inflated here for gzip / deflate, under client_max_size
    return web.json_response({"n": len(body)})


class Harness:
    """One event loop, one aiohttp server for relayed requests, reused across runs."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.errors = _Errors()
        for name in ("appliance", "aiohttp"):
            logging.getLogger(name).addHandler(self.errors)
        # As LogSettings.install does: a client's malformed request is one INFO line.
        logging.getLogger("aiohttp.server").addFilter(logs._CLIENT_HTTP_ERRORS)
        self.loop_errors: list[dict[str, Any]] = []
        self.loop.set_exception_handler(lambda _loop, context: self.loop_errors.append(context))
        self.route = Route()
        self.server = self.loop.run_until_complete(self._server())

    async def _server(self) -> GuardedServer:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        # The front end's own error mapping (frontends/http/server.py), as every route has it.
        app.router.add_route("*", "/{tail:.*}", _guard(_relayed))
        runner = GuardedAppRunner(app, LIMITS, shutdown_timeout=1, infer_route=self.route)
        await runner.setup()  # the server the listener's connections would get
        server = runner.server
        assert isinstance(server, GuardedServer)
        return server

    def _settle(self, steps: int = 8) -> None:
        async def spin() -> None:
            for _ in range(steps):
                await asyncio.sleep(0)

        self.loop.run_until_complete(spin())

    def feed(self, pieces: list[bytes]) -> bytes:
        """The connection's answers to `pieces`, received one after the other."""
        self.errors.records.clear()
        self.loop_errors.clear()
        transport = Transport(self.loop)
        connection = InferConnection(self.server, self.route, self.loop)
        transport.protocol = connection
        connection.connection_made(transport)
        for piece in pieces:
            if transport.closed:
                break
            connection.data_received(piece)
            self._settle()
        if not transport.closed:
            connection.eof_received()
            self._settle()
        if not transport.closed:  # the client goes away: the socket's end, not a close()
            transport.closed = True
            connection.connection_lost(None)
        self._settle(16)
        out = b"".join(transport.written)
        problems = [r.getMessage() for r in self.errors.records]
        problems += [str(c.get("exception") or c.get("message")) for c in self.loop_errors]
        if problems:
            raise AssertionError(f"the connection logged errors: {problems}")
        if b"HTTP/1.1 500" in out:
            raise AssertionError(f"a 500 answer: {out[:300]!r}")
        if out and not out.startswith(b"HTTP/"):  # aiohttp answers HTTP/0.9 with HTTP/0.9
            raise AssertionError(f"an answer that is not HTTP: {out[:100]!r}")
        return out


_HARNESS: Harness | None = None


def http_framing(data: bytes) -> None:
    """Raw bytes to one connection: the first byte says where the stream is cut in two."""
    global _HARNESS
    if _HARNESS is None:
        _HARNESS = Harness()
    if not data:
        return
    cut = data[0] * len(data) // 256 + 1
    pieces = [data[1:cut], data[cut:]]
    with contextlib.suppress(StopIteration):
        _HARNESS.feed([p for p in pieces if p])
