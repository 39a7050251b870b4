"""The infer route on httptools (appliance/frontends/http/fastpath.py) on a real loopback
server: a GuardedAppRunner with a small aiohttp app for the relayed routes and an InferRoute
that records what it was given. Raw bytes go in, so framing, order and closing are what is
checked."""

from __future__ import annotations

import asyncio
import gzip
import inspect
import json
import re
import time
import zlib
from collections.abc import AsyncIterator, Coroutine, Mapping
from email.utils import parsedate_to_datetime
from typing import Any

import pytest
from aiohttp import web
from aiohttp.http import SERVER_SOFTWARE
from aiohttp.web_protocol import RequestHandler

from appliance.common.settings import HttpConnectionLimits
from appliance.frontends.http.connections import GuardedAppRunner, GuardedServer
from appliance.frontends.http.fastpath import (
    PIPELINE_MAX_BYTES,
    Body,
    InferConnection,
    Reply,
    stall,
)

LIMITS = HttpConnectionLimits(
    max_header_bytes=1024,
    max_headers=20,
    header_timeout_secs=5,
    body_timeout_secs=5,
    keepalive_timeout_secs=0.3,
    max_connections=3,
)


class Route:
    """Answers `model` with the body's length; 'slow' after a pause; 'refused' is refused."""

    max_body_bytes = 200_000

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.headers: list[Mapping[str, str]] = []
        self.cancelled = 0
        self.types: list[type] = []

    def admit(self, model: str, version: str, headers: Mapping[str, str]) -> object:
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
        raw_headers: Any,
    ) -> Reply | Coroutine[Any, Any, Reply]:
        self.bodies.append(bytes(body))
        self.types.append(type(body))
        self.headers.append(headers)
        answer = Reply(
            200,
            b"application/json",
            [b'{"model":"%s","v":"%s","n":%d}' % (model.encode(), version.encode(), len(body))],
        )
        if model == "big":  # an answer in two pieces, 2 KB in all
            return Reply(200, b"text/plain", [b"p" * 1000, memoryview(b"q" * 1000)])
        if model != "slow":
            return answer

        async def later() -> Reply:
            try:
                await asyncio.sleep(0.2)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
            return answer

        return later()

    @staticmethod
    def error(status: int, message: str) -> Reply:
        return Reply(status, b"application/json", [b'{"error":"%s"}' % message.encode()])


async def _echo(request: web.Request) -> web.Response:
    body = await request.read()
    return web.json_response({"path": request.path, "n": len(body)})


async def _slow(request: web.Request) -> web.Response:
    await asyncio.sleep(0.3)
    return web.json_response({"path": request.path})


async def _fast(request: web.Request) -> web.Response:
    return web.json_response({"path": request.path})


async def _count(request: web.Request) -> web.Response:
    """A relayed route that reads a body of any size, as the refusal route discards one."""
    n = 0
    async for chunk in request.content.iter_any():
        n += len(chunk)
    return web.json_response({"path": request.path, "n": n})


@pytest.fixture
async def served() -> AsyncIterator[tuple[int, Route, GuardedServer]]:
    app = web.Application()
    app.router.add_route("POST", "/slow", _slow)
    app.router.add_route("POST", "/fast", _fast)
    app.router.add_route("POST", "/count", _count)
    app.router.add_route("*", "/{tail:.*}", _echo)
    route = Route()
    runner = GuardedAppRunner(app, LIMITS, shutdown_timeout=5, infer_route=route)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = next(a[1] for a in runner.addresses if isinstance(a, tuple))
    server = runner.server
    assert isinstance(server, GuardedServer)
    yield port, route, server
    await runner.cleanup()


async def _exchange(port: int, data: bytes, until_closed: bool = True) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    try:
        if until_closed:
            return await asyncio.wait_for(reader.read(), 5)
        return await asyncio.wait_for(reader.read(65536), 5)
    finally:
        writer.close()


def _infer(model: str, body: bytes = b"abc", extra: bytes = b"") -> bytes:
    return b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n%s" % (
        model.encode(),
        len(body),
        extra,
        body,
    )


def _get(path: str, extra: bytes = b"") -> bytes:
    return b"GET %s HTTP/1.1\r\nHost: x\r\n%s\r\n" % (path.encode(), extra)


def _bodies(answer: bytes) -> list[bytes]:
    """The bodies of the answers in `answer`, in order (Content-Length framed)."""
    out = []
    while answer:
        head, _, rest = answer.partition(b"\r\n\r\n")
        if head.startswith(b"HTTP/1.1 100"):
            answer = rest
            continue
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        out.append(rest[:length])
        answer = rest[length:]
    return out


def test_the_aiohttp_hook_the_relay_relies_on() -> None:
    # RelayHandler learns that a relayed answer is out from RequestHandler.finish_response,
    # which aiohttp awaits for every request it answers (parse errors included).
    params = list(inspect.signature(RequestHandler.finish_response).parameters)
    assert params == ["self", "request", "resp", "start_time"]
    assert "finish_response" in inspect.getsource(RequestHandler._handle_request)


async def test_infer_is_answered_here_and_the_rest_by_aiohttp_in_order(served) -> None:  # type: ignore[no-untyped-def]
    port, route, _ = served
    # Pipelined in one write: relayed, answered here (after a pause), relayed, here.
    data = (
        _get("/v2/models/a")
        + _infer("slow", b"12345")
        + _get("/v2/health/ready")
        + _infer("b", b"xy", b"Connection: close\r\n")
    )
    answer = await _exchange(port, data)
    assert _bodies(answer) == [
        b'{"path": "/v2/models/a", "n": 0}',
        b'{"model":"slow","v":"","n":5}',
        b'{"path": "/v2/health/ready", "n": 0}',
        b'{"model":"b","v":"","n":2}',
    ]
    assert route.bodies == [b"12345", b"xy"]  # the others went to aiohttp
    # Every answer carries aiohttp's Server header and a current Date, whoever answered it.
    heads = re.findall(rb"HTTP/1\.1 [^\r]*\r\n(?:[^\r]+\r\n)*", answer)
    assert len(heads) == 4
    servers = {line for h in heads for line in h.split(b"\r\n") if line.startswith(b"Server:")}
    assert servers == {b"Server: " + SERVER_SOFTWARE.encode()}
    for head in heads:
        date = next(line for line in head.split(b"\r\n") if line.startswith(b"Date: "))
        sent = parsedate_to_datetime(date[6:].decode()).timestamp()
        assert abs(sent - time.time()) < 5


async def test_versions_percent_encoding_and_other_methods(served) -> None:  # type: ignore[no-untyped-def]
    port, route, _ = served
    data = (
        _infer("m/versions/3")
        + _infer("with%20space")  # the router decodes names: relayed
        + _get("/v2/models/m/infer", b"Connection: close\r\n")
    )
    assert _bodies(await _exchange(port, data)) == [
        b'{"model":"m","v":"3","n":3}',
        b'{"path": "/v2/models/with space/infer", "n": 3}',
        b'{"path": "/v2/models/m/infer", "n": 0}',
    ]
    assert route.bodies == [b"abc"]


async def test_chunked_bodies_are_decoded_here_and_rechunked_for_aiohttp(served) -> None:  # type: ignore[no-untyped-def]
    port, route, _ = served
    chunked = b"Transfer-Encoding: chunked\r\n"
    body = b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    data = (
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\n" + chunked + b"\r\n" + body
        + b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + chunked
        + b"\r\n" + body
    )  # fmt: skip
    assert _bodies(await _exchange(port, data)) == [
        b'{"model":"m","v":"","n":5}',
        b'{"path": "/v2/repository/index", "n": 5}',
    ]
    assert route.bodies == [b"abcde"]


async def test_gzip_bodies_and_compressed_answers(served) -> None:  # type: ignore[no-untyped-def]
    port, route, _ = served
    packed = gzip.compress(b"x" * 50)
    relayed = _infer("m", packed, b"Content-Encoding: gzip\r\n")  # aiohttp decodes it
    wants = b"Accept-Encoding: deflate\r\nConnection: close\r\n"
    big = _infer("big", b"y", wants)  # an answer >= 1 KB is compressed
    answer = await _exchange(port, relayed + big)
    first, second = _bodies(answer)
    assert first == b'{"path": "/v2/models/m/infer", "n": 50}'
    assert b"Content-Encoding: deflate" in answer
    assert zlib.decompress(second) == b"p" * 1000 + b"q" * 1000
    assert route.bodies == [b"y"]


async def test_expect_continue_is_answered_before_the_body(served) -> None:  # type: ignore[no-untyped-def]
    port, _, _ = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
        b"Expect: 100-continue\r\n\r\n"
    )
    assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == (
        b"HTTP/1.1 100 Continue\r\n\r\n"
    )
    writer.write(b"abc")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 200 OK")
    writer.close()


async def test_limits_and_malformed_requests_close_the_connection(served) -> None:  # type: ignore[no-untyped-def]
    port, route, _ = served
    too_long = await _exchange(port, _get("/v2", b"X-Big: " + b"a" * 1100 + b"\r\n"))
    assert too_long.startswith(b"HTTP/1.1 400 Bad Request")
    assert b"Got more than 1024 bytes when reading" in too_long
    many = b"".join(b"X-H%d: 1\r\n" % i for i in range(30))
    assert b"Too many headers received" in await _exchange(port, _get("/v2", many))
    garbage = await _exchange(port, b"NOT HTTP AT ALL\r\n\r\n")
    assert garbage.startswith(b"HTTP/1.1 400 Bad Request")
    # A body over the route's limit is refused with Triton's error body; the request before
    # it on the connection is still answered.
    over = await _exchange(port, _infer("m") + _infer("m", b"z" * 300_000))
    assert _bodies(over)[0] == b'{"model":"m","v":"","n":3}'
    assert b"HTTP/1.1 413 Request Entity Too Large" in over
    assert route.bodies == [b"abc"]


async def test_refusals_without_a_body_are_answered_here_with_one_relayed(served) -> None:  # type: ignore[no-untyped-def]
    port, route, _ = served
    # No body: answered here. With a body: relayed, so that aiohttp's route discards it a
    # few connections at a time (refusals.py); the echo app stands in for that route here.
    answer = await _exchange(
        port, _infer("refused", b"") + _infer("refused", b"abc", b"Connection: close\r\n")
    )
    assert _bodies(answer) == [
        b'{"error":"overloaded"}',
        b'{"path": "/v2/models/refused/infer", "n": 3}',
    ]
    assert route.bodies == []


async def test_a_large_request_waiting_behind_another_is_read_once_its_turn_comes(served) -> None:  # type: ignore[no-untyped-def]
    # The second request's bytes wait while aiohttp answers the first; past
    # PIPELINE_MAX_BYTES reading is held. Once the second is the one being answered the hold
    # must go, or the rest of its body is never read. (A refused 1 MiB infer body sent right
    # after the previous refusal's answer did this under overload: the connection stalled
    # until the refusal's 10 s discard limit closed it, and the client saw a reset.)
    port, _route, _server = served
    big = b"b" * (PIPELINE_MAX_BYTES + 500_000)
    first = b"POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"
    second = b"POST /count HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(big)
    answer = await _exchange(port, first + second + big + _get("/last", b"Connection: close\r\n"))
    assert [json.loads(b) for b in _bodies(answer)] == [
        {"path": "/slow"},
        {"path": "/count", "n": len(big)},
        {"path": "/last", "n": 0},
    ]


async def test_a_client_that_goes_away_cancels_its_request(served) -> None:  # type: ignore[no-untyped-def]
    port, route, server = served
    _reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_infer("slow"))
    await asyncio.sleep(0.05)
    writer.close()
    for _ in range(50):
        if route.cancelled:
            break
        await asyncio.sleep(0.02)
    assert route.cancelled == 1
    assert not server.fast_connections


async def test_keepalive_timeout_and_connection_limit(served) -> None:  # type: ignore[no-untyped-def]
    port, _, server = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_infer("m"))
    await asyncio.wait_for(reader.readuntil(b'"n":3}'), 5)
    # Idle past keepalive_timeout_secs: closed by the server.
    assert await asyncio.wait_for(reader.read(), 5) == b""
    # max_connections: the fourth open connection is answered 503 and closed.
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
    await asyncio.sleep(0.05)
    assert len(server.fast_connections) == 3
    busy = await _exchange(port, _get("/v2"))
    assert busy.startswith(b"HTTP/1.1 503 Service Unavailable")
    for _, w in held:
        w.close()


async def test_shutdown_answers_what_is_in_progress_then_closes(served) -> None:  # type: ignore[no-untyped-def]
    port, _, server = served
    idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", port)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_infer("slow"))
    await asyncio.sleep(0.05)
    await server.shutdown(5)
    assert b'"model":"slow"' in await asyncio.wait_for(reader.read(), 5)
    assert await asyncio.wait_for(idle_reader.read(), 5) == b""
    assert not server.fast_connections
    writer.close()
    idle_writer.close()


def test_a_connection_is_an_infer_connection_only_with_a_route() -> None:
    def no_requests(*args: Any) -> web.BaseRequest:
        raise AssertionError("no request is made here")

    async def check() -> None:
        plain = GuardedServer(_echo, no_requests, LIMITS, handler_cancellation=True)  # type: ignore[arg-type]
        assert isinstance(plain(), RequestHandler)
        routed = GuardedServer(
            _echo,  # type: ignore[arg-type]
            no_requests,
            LIMITS,
            handler_cancellation=True,
            infer_route=Route(),
        )
        assert isinstance(routed(), InferConnection)

    asyncio.run(check())


async def test_a_large_body_is_read_into_its_own_buffer_across_reads(served, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    port, route, _ = served
    parsed: list[int] = []  # body bytes that went through httptools
    on_body = InferConnection.on_body

    def counting(self: InferConnection, data: bytes) -> None:
        parsed.append(len(data))
        on_body(self, data)

    monkeypatch.setattr(InferConnection, "on_body", counting)
    body = bytes(range(256)) * 600  # 153,600 bytes: read straight into the request's buffer
    request = _infer("m", body)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for start in range(0, len(request), 40_000):  # in pieces, with pauses between them
        writer.write(request[start : start + 40_000])
        await writer.drain()
        await asyncio.sleep(0.01)
    # The next request on the connection is parsed afresh after the directly read body.
    writer.write(_infer("m", b"tail", b"Connection: close\r\n"))
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert _bodies(answer) == [b'{"model":"m","v":"","n":153600}', b'{"model":"m","v":"","n":4}']
    assert route.bodies == [body, b"tail"]
    assert route.types == [bytearray, bytes]
    # Only what came with the headers was parsed; the rest was read into the body itself.
    assert sum(parsed) - 4 < 40_000


@pytest.mark.parametrize(
    ("header_start", "receiving", "last_data", "paused", "expected"),
    [
        (None, False, 0.0, None, None),  # idle, nothing pending
        (95.0, False, 0.0, None, None),  # headers for 5 s: within 20
        (70.0, False, 0.0, None, ("request headers", 20.0, True)),
        (None, True, 80.0, None, None),  # body silent 20 s: within 30
        (None, True, 60.0, None, ("the request body", 30.0, True)),
        (None, False, 60.0, None, None),  # silent, but no body expected
        (None, False, 0.0, 60.0, ("the client to read its response", 30.0, False)),
    ],
)
def test_stall_says_what_waited_too_long(
    header_start: float | None,
    receiving: bool,
    last_data: float,
    paused: float | None,
    expected: tuple[str, float, bool] | None,
) -> None:
    limits = HttpConnectionLimits(header_timeout_secs=20, body_timeout_secs=30)
    late = stall(limits, 100.0, header_start, receiving, last_data, paused)
    if expected is None:
        assert late is None
    else:
        assert late is not None
        what, seconds, answers_408 = expected
        assert late[:2] == (what, seconds)
        assert late[2].startswith(b"HTTP/1.1 408") == answers_408


async def test_a_relayed_answer_before_its_body_is_read_keeps_the_connection_going(served) -> None:  # type: ignore[no-untyped-def]
    # aiohttp answers /fast without reading its 400 KB body, then reads the body off the
    # connection (its lingering read); /slow answers after the body is in. Either way the
    # request after it is answered too, as aiohttp's own connections do. (A stale hand-on
    # from the first request once ended the second before aiohttp answered it: the client got
    # one answer and, at the keep-alive timeout, a closed connection.)
    port, _route, _server = served
    big = b"b" * 400_000
    for path in (b"/fast", b"/slow"):
        first = b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (path, len(big))
        answer = await _exchange(port, first + big + _get("/last", b"Connection: close\r\n"))
        assert [json.loads(b) for b in _bodies(answer)] == [
            {"path": path.decode()},
            {"path": "/last", "n": 0},
        ]
