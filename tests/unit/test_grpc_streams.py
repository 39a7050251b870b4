"""The synchronous gRPC server's threads (frontends/grpc/server.py, admission.py): a thread for
every call the call bound admits plus headroom, and streams bounded apart with
RESOURCE_EXHAUSTED (each holds a thread for its life); the calls: test_grpc_lane.py."""

from __future__ import annotations

import threading

import pytest

from appliance.common.errors import ErrorCode
from appliance.frontends.grpc.admission import StreamSlots, TooManyStreams
from appliance.frontends.grpc.server import (
    POOL_HEADROOM,
    UNARY_RESERVE,
    UNBOUNDED_CALLS,
    pool_threads,
    stream_limit,
)


def test_the_pool_has_a_thread_for_every_admitted_call_and_streams_leave_some() -> None:
    assert pool_threads(64) == 64 + POOL_HEADROOM
    assert pool_threads(0) == UNBOUNDED_CALLS + POOL_HEADROOM  # no bound: still bounded threads
    assert stream_limit(64) == 64 - UNARY_RESERVE
    assert stream_limit(0) == UNBOUNDED_CALLS - UNARY_RESERVE
    assert stream_limit(2) == 1  # a tiny bound still lets one stream open
    for calls in (1, 2, 9, 64, 0):
        assert stream_limit(calls) < pool_threads(calls) - 1  # unary calls keep threads


def test_streams_past_the_limit_are_refused_resource_exhausted() -> None:
    slots = StreamSlots(2)
    slots.take()
    slots.take()
    with pytest.raises(TooManyStreams) as info:
        slots.take()
    assert info.value.code is ErrorCode.RESOURCE_EXHAUSTED
    assert info.value.message.startswith("too many ModelStreamInfer streams open: 2")
    slots.give_back()
    slots.take()  # a stream that ended lets the next one open
    assert slots.in_flight == 2


def test_slots_stay_exact_when_many_threads_take_and_give_back() -> None:
    slots = StreamSlots(1000)

    def churn() -> None:
        for _ in range(2000):
            slots.take()
            slots.give_back()

    threads = [threading.Thread(target=churn) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert slots.in_flight == 0
