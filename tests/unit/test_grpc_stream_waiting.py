"""The bound on a ModelStreamInfer stream's responses waiting for the handler thread
(frontends/grpc/stream.py, `_Waiting`): at most STREAM_MAX_IN_FLIGHT responses, and
STREAM_MAX_WAITING_BYTES of tensor data unless one alone is larger; a put waits on the loop
until the handler thread takes one, and wakes when it does."""

from __future__ import annotations

import asyncio
import queue
from typing import Any

from appliance.common.protocol import service_pb2 as pb
from appliance.frontends.grpc.stream import (
    STREAM_MAX_IN_FLIGHT,
    STREAM_MAX_WAITING_BYTES,
    _Waiting,
)


def _taken(events: queue.SimpleQueue[tuple[int, Any]], waiting: _Waiting) -> pb.Message:
    _, (message, size) = events.get_nowait()
    waiting.taken(size)
    return message


async def test_a_put_past_the_byte_bound_waits_until_the_handler_takes_one() -> None:
    events: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()
    waiting = _Waiting(asyncio.get_running_loop(), events)
    big = STREAM_MAX_WAITING_BYTES // 2 + 1
    await waiting.put(pb.ModelStreamInferResponse(error_message="a"), big)
    second = asyncio.ensure_future(waiting.put(pb.ModelStreamInferResponse(error_message="b"), big))
    await asyncio.sleep(0.05)
    assert not second.done()  # held: the two would pass the bound
    assert events.qsize() == 1
    # The handler thread takes the first (from another thread, as in the server).
    first = await asyncio.to_thread(_taken, events, waiting)
    assert first.error_message == "a"
    await asyncio.wait_for(second, 5)
    assert _taken(events, waiting).error_message == "b"


async def test_one_response_alone_larger_than_the_bound_goes_in() -> None:
    events: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()
    waiting = _Waiting(asyncio.get_running_loop(), events)
    await asyncio.wait_for(
        waiting.put(pb.ModelStreamInferResponse(), 3 * STREAM_MAX_WAITING_BYTES), 5
    )
    assert events.qsize() == 1


async def test_puts_past_the_count_bound_wait_and_all_go_in_in_order() -> None:
    events: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()
    waiting = _Waiting(asyncio.get_running_loop(), events)
    extra = 5
    puts = [
        asyncio.ensure_future(waiting.put(pb.ModelStreamInferResponse(error_message=str(i))))
        for i in range(STREAM_MAX_IN_FLIGHT + extra)
    ]
    await asyncio.sleep(0.05)
    assert events.qsize() == STREAM_MAX_IN_FLIGHT
    assert sum(not put.done() for put in puts) == extra
    got: list[Any] = []
    while len(got) < len(puts):
        if events.empty():
            await asyncio.sleep(0.01)
            continue
        got.append(await asyncio.to_thread(_taken, events, waiting))
    await asyncio.wait_for(asyncio.gather(*puts), 5)
    assert sorted(int(m.error_message) for m in got) == list(range(len(puts)))
