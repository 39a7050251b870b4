"""The infer route against plain aiohttp, byte for byte from the client's side: random
pipelined sequences of relayed and local requests (small and large bodies, chunked bodies,
handlers that answer before reading their body, slow ones), sent in one write or in random
pieces, must get the same answers, in the same order, from an InferConnection as from
aiohttp's own protocol serving the same routes. (It finds the pipeline hold that kept a
waiting body unread past its turn: case 2 of seed 20 fails without that fix.)"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from appliance.frontends.http.connections import GuardedAppRunner
from tests.unit.test_http_fastpath import LIMITS, Route, _count, _echo, _fast, _slow

CASES = 40


async def _infer(request: web.Request) -> web.Response:
    """What `Route` answers for an infer request, as an aiohttp handler."""
    model = request.match_info["model"]
    body = await request.read()
    if model == "slow":
        await asyncio.sleep(0.2)
    return web.json_response({"model": model, "v": "", "n": len(body)})


def _app(with_infer: bool) -> web.Application:
    app = web.Application(client_max_size=1 << 20)
    app.router.add_route("POST", "/slow", _slow)
    app.router.add_route("POST", "/fast", _fast)
    app.router.add_route("POST", "/count", _count)
    if with_infer:
        app.router.add_route("POST", "/v2/models/{model}/infer", _infer)
    app.router.add_route("*", "/{tail:.*}", _echo)
    return app


async def _start(runner: web.AppRunner) -> int:
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return next(a[1] for a in runner.addresses if isinstance(a, tuple))


@pytest.fixture
async def ports() -> AsyncIterator[tuple[int, int]]:
    ours = GuardedAppRunner(_app(False), LIMITS, shutdown_timeout=5, infer_route=Route())
    plain = web.AppRunner(_app(True))
    yield await _start(ours), await _start(plain)
    await ours.cleanup()
    await plain.cleanup()


def _post(path: str, size: int, chunked: bool = False) -> bytes:
    body = bytes(random.getrandbits(8) for _ in range(min(size, 64))) * (size // 64 + 1)
    body = body[:size]
    if not chunked:
        return b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (
            path.encode(),
            size,
            body,
        )
    pieces = [body[i : i + 7000] for i in range(0, size, 7000)]
    framed = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    return b"POST %s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n%s" % (
        path.encode(),
        framed,
    )


def _request(rng: random.Random) -> bytes:
    kind = rng.choice(["get", "count", "fast", "slow", "infer", "infer-big", "slow-infer"])
    if kind == "get":
        return b"GET /x?a=%d HTTP/1.1\r\nHost: x\r\n\r\n" % rng.randrange(100)
    if kind == "count":
        return _post("/count", rng.choice([0, 10, 100_000, 300_000]), chunked=rng.random() < 0.3)
    if kind == "fast":
        return _post("/fast", rng.choice([0, 5, 200_000, 400_000]))
    if kind == "slow":
        return _post("/slow", rng.choice([2, 150_000]))
    if kind == "infer":
        return _post("/v2/models/a/infer", rng.choice([3, 1000]), chunked=rng.random() < 0.3)
    if kind == "infer-big":  # read straight into its own buffer by the route
        return _post("/v2/models/b/infer", rng.choice([70_000, 150_000]))
    return _post("/v2/models/slow/infer", 10)


def _answers(raw: bytes) -> list[tuple[int, Any]]:
    out = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        out.append((status, json.loads(rest[:length])))
        raw = rest[length:]
    return out


async def _send(port: int, data: bytes, cuts: list[int]) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        start = 0
        for cut in [*cuts, len(data)]:
            writer.write(data[start:cut])
            await writer.drain()
            if cut != len(data):
                await asyncio.sleep(0.005)
            start = cut
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


async def test_random_pipelines_are_answered_as_aiohttp_answers_them(ports) -> None:  # type: ignore[no-untyped-def]
    ours, plain = ports
    rng = random.Random(20)
    for case in range(CASES):
        requests = [_request(rng) for _ in range(rng.randrange(1, 5))]
        requests.append(b"GET /last HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b"".join(requests)
        cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.choice([0, 1, 3]))))
        got, expected = await asyncio.gather(_send(ours, data, cuts), _send(plain, data, cuts))
        heads = [r.split(b"\r\n", 1)[0] for r in requests]
        assert _answers(got) == _answers(expected), f"case {case}: {heads}, cut at {cuts}"
