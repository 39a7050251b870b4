"""The relay: a request the infer fast path does not answer goes to a fresh aiohttp protocol.

fastpath.py's `InferConnection` parses every request with httptools; anything but a plain
infer request (other routes, compressed bodies, percent-encoded names, HTTP/1.0, an upgrade) is
re-framed from what httptools parsed and fed to a `RelayHandler`, aiohttp's own connection
protocol, which writes through a `RelayTransport` onto the same connection. aiohttp then
answers it with every route, limit and error text unchanged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from aiohttp.web_protocol import RequestHandler


class RelayOwner(Protocol):
    """What a RelayTransport tells the connection it writes to (fastpath.InferConnection)."""

    def relay_closed(self) -> None: ...

    def hold(self, reason: str) -> None: ...

    def release(self, reason: str) -> None: ...


class RelayHandler(RequestHandler):
    """aiohttp's connection protocol for one relayed request: tells its connection when the
    response is written (`finish_response`, which aiohttp calls for every request it answers,
    parse errors included). `raw_headers`: the request's headers as httptools gave them
    (aiohttp's parser strips the whitespace that ends a value; header forwarding gives the
    model the value as sent, as tritonserver)."""

    def __init__(self, manager: Any, on_finished: Callable[[bool], None], **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._on_finished = on_finished
        self.raw_headers: Sequence[tuple[bytes, bytes]] = ()

    async def finish_response(self, request: Any, resp: Any, start_time: float | None) -> Any:
        keep_alive = False
        try:
            answer = await super().finish_response(request, resp, start_time)
            keep_alive = bool(resp.keep_alive)  # as aiohttp decides after this returns
            return answer
        finally:
            self._on_finished(keep_alive)


class RelayTransport(asyncio.Transport):
    """The transport a RelayHandler writes to: the connection's own, which it may close."""

    def __init__(self, connection: RelayOwner, real: asyncio.Transport) -> None:
        super().__init__()
        self._connection = connection
        self._real = real
        self._closing = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._real.get_extra_info(name, default)

    def is_closing(self) -> bool:
        return self._closing or self._real.is_closing()

    def close(self) -> None:  # aiohttp is done with the connection (Connection: close, errors)
        if not self._closing:
            self._closing = True
            self._connection.relay_closed()

    def detach(self) -> None:
        """The connection is done with aiohttp: nothing of aiohttp's reaches it any more (its
        `connection_lost` closes this transport)."""
        self._closing = True

    def abort(self) -> None:
        self._closing = True
        self._real.abort()

    def write(self, data: Any) -> None:
        if not self._closing:
            self._real.write(data)

    def writelines(self, list_of_data: Any) -> None:
        if not self._closing:
            self._real.writelines(list_of_data)

    def can_write_eof(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return self._real.get_write_buffer_size()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass  # the connection's own limits hold

    def pause_reading(self) -> None:  # aiohttp's payload buffer is full
        self._connection.hold("relay")

    def resume_reading(self) -> None:
        self._connection.release("relay")

    def is_reading(self) -> bool:
        return self._real.is_reading()
