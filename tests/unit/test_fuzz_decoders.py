"""Fuzz smoke: whatever arrives, a decoder answers with a result or an ApplianceError (a
precise 4xx), never another exception (a 500). A few thousand cases in seconds; findings
become cases in tests/integration/test_errors.py."""

from __future__ import annotations

import contextlib
import json
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.common.errors import ApplianceError
from appliance.common.model_config import parse_config_text
from appliance.common.protocol import service_pb2 as pb
from appliance.common.serialization import decode_bytes
from appliance.frontends.grpc.codec import decode_request as grpc_decode
from appliance.frontends.http.codec import decode_request as http_decode
from appliance.repository.s3 import RemoteObject, S3Location, group_objects
from appliance.services.shared_memory import SharedMemoryRegistry

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DATATYPES = ["BOOL", "INT8", "INT32", "INT64", "UINT8", "FP16", "FP32", "FP64", "BYTES", "X"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)
tensors = st.fixed_dictionaries(
    {
        "name": st.text(max_size=6) | st.integers(),
        "datatype": st.sampled_from(DATATYPES) | st.integers(),
        "shape": st.lists(st.integers(-3, 1 << 40), max_size=4) | json_values,
    },
    optional={
        "data": json_values,
        "parameters": st.dictionaries(
            st.sampled_from(
                [
                    "binary_data_size",
                    "shared_memory_region",
                    "shared_memory_byte_size",
                    "shared_memory_offset",
                    "x",
                ]
            ),
            json_values | st.integers(-5, 1 << 40),
            max_size=3,
        ),
    },
)


def _ok_or_appliance_error(call) -> None:  # type: ignore[no-untyped-def]
    with contextlib.suppress(ApplianceError):
        call()


@FUZZ
@given(
    st.binary(max_size=256),
    st.one_of(st.none(), st.integers(-5, 300).map(str), st.text(max_size=4)),
)
def test_http_decoder_on_arbitrary_bytes(body: bytes, header: str | None) -> None:
    _ok_or_appliance_error(lambda: http_decode(body, header, "m", "", SharedMemoryRegistry()))


@FUZZ
@given(st.lists(tensors, max_size=3), st.binary(max_size=64), json_values)
def test_http_decoder_on_structured_requests(inputs, tail: bytes, outputs) -> None:  # type: ignore[no-untyped-def]
    header = json.dumps({"inputs": inputs, "outputs": outputs}).encode()
    body = header + tail
    _ok_or_appliance_error(
        lambda: http_decode(body, str(len(header)), "m", "", SharedMemoryRegistry())
    )


@FUZZ
@given(st.binary(max_size=200), st.integers(0, 1 << 40))
def test_bytes_decoder(raw: bytes, count: int) -> None:
    _ok_or_appliance_error(lambda: decode_bytes(raw, count, "w"))


@FUZZ
@given(st.lists(st.binary(max_size=12), max_size=5))
def test_bytes_round_trip_prefixes(items: list[bytes]) -> None:
    raw = b"".join(struct.pack("<I", len(i)) + i for i in items)
    assert list(decode_bytes(raw, len(items), "w")) == items


@FUZZ
@given(st.binary(max_size=300))
def test_grpc_decoder_on_arbitrary_messages(blob: bytes) -> None:
    try:
        message = pb.ModelInferRequest.FromString(blob)
    except Exception:  # not a message at all: grpcio refuses it before us
        return
    _ok_or_appliance_error(lambda: grpc_decode(message, SharedMemoryRegistry()))


@FUZZ
@given(st.text(max_size=200))
def test_config_text(text: str) -> None:
    _ok_or_appliance_error(lambda: parse_config_text(text, "config.pbtxt"))


@FUZZ
@given(
    st.lists(
        st.builds(
            RemoteObject,
            key=st.text(max_size=30),
            size=st.integers(0, 10),
            etag=st.text(max_size=34),
            modified=st.floats(0, 1e10),
        ),
        max_size=10,
    ),
    st.text(max_size=8),
)
def test_s3_listing_grouping(objects: list[RemoteObject], prefix: str) -> None:
    models = group_objects(prefix, objects)
    for name, model in models.items():
        assert name
        assert "/" not in name
        assert all(v >= 0 for v in model.versions)


@FUZZ
@given(st.text(max_size=40))
def test_s3_location_parsing(url: str) -> None:
    with contextlib.suppress(ValueError):
        S3Location.parse("s3://" + url)
