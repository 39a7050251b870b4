"""The server-wide gRPC call bound as the servicer's wrapper uses it (frontends/grpc/admission.py);
the calls themselves: tests/integration/test_grpc_bounds.py."""

from __future__ import annotations

import pytest

from appliance.common.errors import ErrorCode, ServerUnavailable
from appliance.frontends.grpc.admission import CallBound


def test_calls_past_the_limit_are_refused_naming_the_flag() -> None:
    bound = CallBound(2)
    bound.take()
    bound.take()
    with pytest.raises(ServerUnavailable) as info:
        bound.take()
    assert info.value.code is ErrorCode.UNAVAILABLE
    assert info.value.message == (
        "server busy: 2 gRPC calls in flight, the most --grpc-max-concurrent-rpcs allows (2); "
        "retry later"
    )
    assert bound.in_flight == 2  # a refused call holds no slot
    bound.give_back()
    bound.take()  # a slot given back admits the next call
    assert bound.in_flight == 2


def test_health_calls_and_no_limit_take_no_slot() -> None:
    bound = CallBound(1)
    assert not bound.counts("ServerLive")
    assert not bound.counts("ServerReady")
    assert not bound.counts("ModelReady")
    assert bound.counts("ModelInfer")
    assert bound.counts("ModelStreamInfer")
    assert bound.counts("ServerMetadata")
    assert not CallBound(0).counts("ModelInfer")
