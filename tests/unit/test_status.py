"""The one error-code table covers every code, for both protocols."""

from __future__ import annotations

import grpc

from appliance.common.errors import ErrorCode, InvalidInput, ModelNotFound, QueueFull
from appliance.frontends.status import GRPC_STATUS, HTTP_STATUS


def test_every_code_maps_to_http_and_grpc() -> None:
    assert set(HTTP_STATUS) == set(ErrorCode)
    assert set(GRPC_STATUS) == set(ErrorCode)


def test_common_errors_map_as_triton_does() -> None:
    assert HTTP_STATUS[InvalidInput.code] == 400
    assert GRPC_STATUS[InvalidInput.code] == grpc.StatusCode.INVALID_ARGUMENT
    assert HTTP_STATUS[ModelNotFound.code] == 404
    assert HTTP_STATUS[QueueFull.code] == 503
    assert GRPC_STATUS[QueueFull.code] == grpc.StatusCode.UNAVAILABLE
