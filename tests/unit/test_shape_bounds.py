"""Declared shapes numpy cannot hold are refused before numpy sees them (issue 17, item 5):
every decoder (HTTP JSON and binary, gRPC raw and typed contents, shared memory) counts
elements through appliance/common/tensors.element_count."""

from __future__ import annotations

import pytest

from appliance.common.errors import InvalidInput, RequestTooLarge
from appliance.common.limits import NO_LIMITS, RequestLimits
from appliance.common.protocol import service_pb2 as pb
from appliance.common.tensors import MAX_DIMS, MAX_SHAPE_PRODUCT, element_count, from_list, from_raw
from appliance.frontends.grpc.codec import decode_request as grpc_decode
from appliance.frontends.http.codec import decode_request as http_decode

WHERE = "model 'm' input 'X'"
HUGE = 2**62


@pytest.mark.parametrize("limits", [None, NO_LIMITS, RequestLimits()])
def test_zero_elements_with_huge_dimensions(limits: RequestLimits | None) -> None:
    with pytest.raises(InvalidInput) as info:
        element_count((HUGE, 0, HUGE), WHERE, limits)
    assert info.value.message == (
        f"{WHERE}: shape [{HUGE}, 0, {HUGE}] is out of range: its dimensions other than 0 "
        f"multiply to {HUGE * HUGE}, more than {MAX_SHAPE_PRODUCT}"
    )


def test_zero_elements_within_range_are_a_valid_empty_tensor() -> None:
    assert element_count((2**20, 0, 2**20), WHERE) == 0
    assert from_list([], "INT64", (2**20, 0, 2**20), WHERE).shape == (2**20, 0, 2**20)
    assert from_raw(b"", "FP64", (2**29, 0, 2**30), WHERE).shape == (2**29, 0, 2**30)
    # The largest product numpy can index for 8-byte items.
    assert from_raw(b"", "FP64", (MAX_SHAPE_PRODUCT, 0), WHERE).size == 0
    with pytest.raises(InvalidInput, match="is out of range"):
        from_raw(b"", "FP64", (MAX_SHAPE_PRODUCT + 1, 0), WHERE)


def test_an_element_limit_still_answers_first_for_tensors_with_elements() -> None:
    # A shape a tensor can have: the element limit answers (413).
    with pytest.raises(RequestTooLarge):
        element_count((2**10, 2**40), WHERE, RequestLimits())
    assert element_count((2**10, 2**40), WHERE, NO_LIMITS) == 2**50
    # One whose byte size overflows (tritonserver: 400 'byte size overflow for input'): a bad
    # request, whatever the limits.
    for limits in (RequestLimits(), NO_LIMITS):
        with pytest.raises(InvalidInput, match=r"byte size overflow for input: .* out of range"):
            element_count((4, 2**60 + 2), WHERE, limits)


def test_an_element_count_past_int64_is_a_bad_request_in_tritons_words() -> None:
    """tritonserver: 400 `... causes total element count to exceed maximum size of ...`,
    whatever the size limits (the shape is invalid, not too large)."""
    for limits in (RequestLimits(), NO_LIMITS):
        with pytest.raises(InvalidInput) as info:
            element_count((HUGE, HUGE), WHERE, limits)
        assert info.value.message == (
            f"{WHERE}: invalid shape [{HUGE}, {HUGE}]: it causes total element count to "
            f"exceed maximum size of {2**63 - 1}"
        )


def test_more_dimensions_than_numpy_holds() -> None:
    assert element_count((1,) * MAX_DIMS, WHERE) == 1
    with pytest.raises(InvalidInput) as info:
        element_count((1,) * (MAX_DIMS + 1), WHERE)
    assert info.value.message == (
        f"{WHERE}: shape has {MAX_DIMS + 1} dimensions, more than the {MAX_DIMS} allowed"
    )
    with pytest.raises(InvalidInput, match="dimensions, more than"):
        from_list([1], "INT32", (1,) * (MAX_DIMS + 1), WHERE)


def test_http_decoder_refuses_both_before_numpy() -> None:
    for shape in ([HUGE, 0, HUGE], [1] * 65):
        body = b'{"inputs":[{"name":"X","datatype":"INT32","shape":%s,"data":[]}]}' % (
            str(shape).encode()
        )
        with pytest.raises(InvalidInput, match="model 'm' input 'X': shape"):
            http_decode(body, None, "m", "")


@pytest.mark.parametrize("raw", [True, False])
def test_grpc_decoder_refuses_both_before_numpy(raw: bool) -> None:
    for shape in ([HUGE, 0, HUGE], [1] * 65):
        msg = pb.ModelInferRequest(model_name="m")
        tensor = msg.inputs.add(name="X", datatype="INT32")
        tensor.shape.extend(shape)
        if raw:
            msg.raw_input_contents.append(b"")
        with pytest.raises(InvalidInput, match="model 'm' input 'X': shape"):
            grpc_decode(msg)
