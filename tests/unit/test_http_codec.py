"""KServe v2 HTTP bodies <-> core types (appliance/frontends/http/codec.py)."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format

from appliance.common.errors import InvalidInput
from appliance.common.protocol import ModelConfig
from appliance.common.tensors import encode_bytes
from appliance.common.types import InferRequest, InferResponse, RequestedOutput, Tensor
from appliance.frontends.http.codec import (
    HttpInferRequest,
    decode_request,
    encode_response,
)


def header(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode()


def binary_request(doc: dict[str, Any], *blobs: bytes) -> tuple[bytes, str]:
    head = header(doc)
    return head + b"".join(blobs), str(len(head))


def split(
    chunks: list[bytes | memoryview], header_length: int | None
) -> tuple[dict[str, Any], bytes]:
    body = b"".join(bytes(c) for c in chunks)
    if header_length is None:
        return json.loads(body), b""
    return json.loads(body[:header_length]), body[header_length:]


def response(*tensors: Tensor, **kwargs: Any) -> InferResponse:
    return InferResponse(model_name="m", model_version="1", id="", outputs=list(tensors), **kwargs)


def wire(binary_default: bool = False, **binary_outputs: bool) -> HttpInferRequest:
    return HttpInferRequest(InferRequest("m"), binary_default, dict(binary_outputs))


# ---- decode_request --------------------------------------------------------------------------


def test_decode_json_inputs() -> None:
    body = header(
        {
            "id": "req-1",
            "inputs": [
                {"name": "A", "datatype": "INT32", "shape": [2, 2], "data": [[1, -2], [3, 4]]},
                {"name": "B", "datatype": "BYTES", "shape": [2], "data": ["", "\u00e9"]},
            ],
            "parameters": {"priority": 3},
        }
    )
    decoded = decode_request(body, None, "m", "2")
    request = decoded.request
    assert (request.model_name, request.model_version, request.id) == ("m", "2", "req-1")
    assert request.parameters == {"priority": 3}
    assert request.outputs is None
    a, b = request.inputs
    assert (a.name, a.datatype, a.shape) == ("A", "INT32", (2, 2))
    assert a.data.dtype == np.int32
    assert a.data.tolist() == [[1, -2], [3, 4]]
    assert (b.name, b.datatype, b.shape) == ("B", "BYTES", (2,))
    assert b.data.tolist() == [b"", "\u00e9".encode()]
    assert decoded.binary_default is False
    assert decoded.binary_outputs == {}


def test_decode_json_nan_and_infinity_tokens() -> None:
    body = (
        b'{"inputs":[{"name":"F","datatype":"FP32","shape":[3],"data":[NaN,Infinity,-Infinity]}]}'
    )
    data = decode_request(body, None, "m", "").request.inputs[0].data
    assert data.dtype == np.float32
    assert np.isnan(data[0])
    assert data[1] == np.inf
    assert data[2] == -np.inf


def test_decode_binary_inputs_in_order() -> None:
    a = np.array([[1.5, -0.0, np.inf]], dtype=np.float32)
    b = np.array([1, 2**63 - 1], dtype=np.int64)
    s = np.array([b"\xff", b""], dtype=np.object_)
    raw_s = encode_bytes(s)
    body, length = binary_request(
        {
            "inputs": [
                {
                    "name": "A",
                    "datatype": "FP32",
                    "shape": [1, 3],
                    "parameters": {"binary_data_size": a.nbytes},
                },
                {"name": "J", "datatype": "UINT8", "shape": [2], "data": [0, 255]},
                {
                    "name": "B",
                    "datatype": "INT64",
                    "shape": [2],
                    "parameters": {"binary_data_size": b.nbytes},
                },
                {
                    "name": "S",
                    "datatype": "BYTES",
                    "shape": [2],
                    "parameters": {"binary_data_size": len(raw_s)},
                },
            ]
        },
        a.tobytes(),
        b.tobytes(),
        raw_s,
    )
    inputs = {t.name: t.data for t in decode_request(body, length, "m", "").request.inputs}
    assert inputs["A"].tobytes() == a.tobytes()
    assert inputs["A"].shape == (1, 3)
    assert inputs["J"].tolist() == [0, 255]
    assert inputs["B"].tolist() == b.tolist()
    assert inputs["S"].tolist() == [b"\xff", b""]


def test_decode_requested_outputs_and_binary_choices() -> None:
    body = header(
        {
            "inputs": [],
            "outputs": [
                {"name": "O1", "parameters": {"binary_data": False, "classification": 3}},
                {"name": "O2", "parameters": {"binary_data": True}},
                {"name": "O3"},
            ],
            "parameters": {"binary_data_output": True},
        }
    )
    decoded = decode_request(body, None, "m", "")
    assert decoded.request.outputs == [
        RequestedOutput("O1", 3),
        RequestedOutput("O2", 0),
        RequestedOutput("O3", 0),
    ]
    assert decoded.binary_default is True
    assert decoded.binary_outputs == {"O1": False, "O2": True}


@pytest.mark.parametrize(
    ("body", "header_length", "message"),
    [
        (b'{"inputs": [', None, "malformed JSON in the inference request"),
        (b"[]", None, "request body must be a JSON object"),
        (b"{}", None, "inference request for model 'm' has no 'inputs' list"),
        (b'{"inputs": {}}', None, "inference request for model 'm' has no 'inputs' list"),
        (b'{"inputs": [{"datatype": "INT32"}]}', None, "model 'm': inputs[0] has no 'name'"),
        (
            b'{"inputs": [{"name": "A", "shape": [1], "data": [1]}]}',
            None,
            "model 'm' input 'A': 'datatype' is missing",
        ),
        (
            b'{"inputs": [{"name": "A", "datatype": "INT32", "shape": [true], "data": [1]}]}',
            None,
            "model 'm' input 'A': 'shape' must be a list of integers, got [True]",
        ),
        (
            b'{"inputs": [{"name": "A", "datatype": "INT32", "shape": [1]}]}',
            None,
            "model 'm' input 'A': no 'data' and no binary_data_size parameter",
        ),
        (
            b'{"inputs": [{"name": "A", "datatype": "INT32", "shape": [2], "data": [1]}]}',
            None,
            "model 'm' input 'A': unexpected number of elements 1, expecting 2 for shape [2]",
        ),
        (
            b'{"inputs": []}',
            "100",
            "inference header size should be in range (0, 14), got: 100",
        ),
        (b'{"inputs": []}', "x", "Unable to parse Inference-Header-Content-Length, got: x"),
        (
            b'{"inputs": []}',
            "-1",
            "inference header size should be in range (0, 14), got: -1",
        ),
        (
            b'{"inputs": []}XY',
            "14",
            "inference request for model 'm' has 2 bytes of binary data that no input claims",
        ),
        (b'{"inputs": [], "outputs": {}}', None, "'outputs' must be a list"),
        (b'{"inputs": [], "outputs": [{}]}', None, "model 'm': outputs[0] has no 'name'"),
        (
            b'{"inputs": [], "outputs": [{"name": "O", "parameters": {"classification": "2"}}]}',
            None,
            "output 'O': classification must be an integer",
        ),
        (b'{"inputs": [], "parameters": []}', None, "request parameters must be a JSON object"),
    ],
    ids=[
        "malformed",
        "not-object",
        "no-inputs",
        "inputs-not-list",
        "no-name",
        "no-datatype",
        "shape-bool",
        "no-data",
        "count",
        "header-too-long",
        "header-not-int",
        "header-negative",
        "unclaimed",
        "outputs-not-list",
        "output-no-name",
        "classification-str",
        "parameters-not-object",
    ],
)
def test_decode_errors(body: bytes, header_length: str | None, message: str) -> None:
    with pytest.raises(InvalidInput) as info:
        decode_request(body, header_length, "m", "")
    assert message in info.value.message


@pytest.mark.parametrize(
    ("size", "payload", "message"),
    [
        (8, b"\x00" * 8, "input byte size mismatch for input 'A' for model 'm'. Expected 12"),
        (16, b"\x00" * 12, "binary_data_size 16 exceeds the 12 bytes of binary data left"),
        (-1, b"", "model 'm' input 'A': binary_data_size must be a non-negative integer"),
        (
            "12",
            b"\x00" * 12,
            "model 'm' input 'A': binary_data_size must be a non-negative integer",
        ),
    ],
)
def test_decode_binary_size_errors(size: Any, payload: bytes, message: str) -> None:
    body, length = binary_request(
        {
            "inputs": [
                {
                    "name": "A",
                    "datatype": "FP32",
                    "shape": [3],
                    "parameters": {"binary_data_size": size},
                }
            ]
        },
        payload,
    )
    with pytest.raises(InvalidInput) as info:
        decode_request(body, length, "m", "")
    assert message in info.value.message


# ---- encode_response -------------------------------------------------------------------------

FLOATS = Tensor("F", "FP32", (1, 3), np.array([[1.5, -2.0, 0.25]], dtype=np.float32))
INTS = Tensor("I", "INT64", (2,), np.array([-(2**63), 2**63 - 1], dtype=np.int64))
STRINGS = Tensor("S", "BYTES", (2,), np.array([b"\xc3\xa9", b""], dtype=np.object_))


def test_encode_json_only() -> None:
    chunks, length = encode_response(response(FLOATS, INTS, STRINGS), wire())
    assert length is None
    assert len(chunks) == 1
    doc, rest = split(chunks, length)
    assert rest == b""
    assert doc == {
        "model_name": "m",
        "model_version": "1",
        "outputs": [
            {"name": "F", "datatype": "FP32", "shape": [1, 3], "data": [1.5, -2.0, 0.25]},
            {"name": "I", "datatype": "INT64", "shape": [2], "data": [-(2**63), 2**63 - 1]},
            {"name": "S", "datatype": "BYTES", "shape": [2], "data": ["\u00e9", ""]},
        ],
    }


def test_encode_all_binary() -> None:
    chunks, length = encode_response(response(FLOATS, INTS, STRINGS), wire(binary_default=True))
    assert length is not None
    doc, rest = split(chunks, length)
    sizes = [o["parameters"]["binary_data_size"] for o in doc["outputs"]]
    assert all("data" not in o for o in doc["outputs"])
    assert sizes == [12, 16, len(encode_bytes(STRINGS.data))]
    assert rest == FLOATS.data.tobytes() + INTS.data.tobytes() + encode_bytes(STRINGS.data)
    assert len(rest) == sum(sizes)


def test_per_output_binary_data_overrides_default_false() -> None:
    chunks, length = encode_response(response(FLOATS, INTS, STRINGS), wire(False, I=True))
    assert length is not None
    doc, rest = split(chunks, length)
    by_name = {o["name"]: o for o in doc["outputs"]}
    assert by_name["F"]["data"] == [1.5, -2.0, 0.25]
    assert by_name["S"]["data"] == ["\u00e9", ""]
    assert by_name["I"]["parameters"] == {"binary_data_size": 16}
    assert "data" not in by_name["I"]
    assert rest == INTS.data.tobytes()


def test_per_output_binary_data_overrides_default_true() -> None:
    chunks, length = encode_response(response(FLOATS, INTS), wire(True, F=False))
    assert length is not None
    doc, rest = split(chunks, length)
    by_name = {o["name"]: o for o in doc["outputs"]}
    assert by_name["F"]["data"] == [1.5, -2.0, 0.25]
    assert "parameters" not in by_name["F"]
    assert by_name["I"]["parameters"] == {"binary_data_size": 16}
    assert rest == INTS.data.tobytes()


def test_all_outputs_json_by_override_has_no_binary_part() -> None:
    chunks, length = encode_response(response(FLOATS), wire(True, F=False))
    assert length is None
    assert split(chunks, length)[0]["outputs"][0]["data"] == [1.5, -2.0, 0.25]


@pytest.mark.parametrize("datatype", ["FP16", "FP32", "FP64"])
def test_nan_and_infinity_in_json_output(datatype: str) -> None:
    values = np.array(
        [np.nan, np.inf, -np.inf, 1.0],
        dtype={"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}[datatype],
    )
    tensor = Tensor("F", datatype, (4,), values)
    chunks, length = encode_response(response(tensor), wire())
    assert length is None
    text = bytes(chunks[0]).decode()
    assert "null" not in text
    assert '"data":[NaN,Infinity,-Infinity,1.0]' in text
    data = json.loads(text)["outputs"][0]["data"]
    assert math.isnan(data[0])
    assert data[1:] == [math.inf, -math.inf, 1.0]


def test_nan_in_one_output_keeps_other_outputs_exact() -> None:
    nan = Tensor("N", "FP64", (1,), np.array([np.nan]))
    chunks, _ = encode_response(response(nan, INTS, STRINGS), wire())
    doc = json.loads(bytes(chunks[0]))
    by_name = {o["name"]: o["data"] for o in doc["outputs"]}
    assert math.isnan(by_name["N"][0])
    assert by_name["I"] == [-(2**63), 2**63 - 1]
    assert by_name["S"] == ["\u00e9", ""]


def test_nan_in_binary_output_is_raw() -> None:
    nan = Tensor("N", "FP32", (2,), np.array([np.nan, -np.inf], dtype=np.float32))
    chunks, length = encode_response(response(nan), wire(binary_default=True))
    doc, rest = split(chunks, length)
    assert doc["outputs"][0]["parameters"] == {"binary_data_size": 8}
    assert rest == nan.data.tobytes()


def test_encode_id_and_parameters() -> None:
    resp = response(INTS, parameters={"sequence_end": True})
    resp.id = "abc"
    doc, _ = split(*encode_response(resp, wire()))
    assert doc["id"] == "abc"
    assert doc["parameters"] == {"sequence_end": True}
    doc, _ = split(*encode_response(response(INTS), wire()))
    assert "id" not in doc
    assert "parameters" not in doc


def test_round_trip_decode_then_encode() -> None:
    """A binary request's tensors come back bit-for-bit in a binary response."""
    a = np.array(
        [[np.nan, -0.0], [np.finfo(np.float16).max, np.finfo(np.float16).tiny]], dtype=np.float16
    )
    body, length = binary_request(
        {
            "inputs": [
                {
                    "name": "A",
                    "datatype": "FP16",
                    "shape": [2, 2],
                    "parameters": {"binary_data_size": a.nbytes},
                }
            ],
            "parameters": {"binary_data_output": True},
        },
        a.tobytes(),
    )
    decoded = decode_request(body, length, "m", "")
    tensor = decoded.request.inputs[0]
    out = Tensor("A", tensor.datatype, tensor.shape, tensor.data)
    doc, rest = split(*encode_response(response(out), decoded))
    assert doc["outputs"][0]["shape"] == [2, 2]
    assert rest == a.tobytes()


def _config(text: str) -> ModelConfig:
    return text_format.Parse(text, ModelConfig())


def test_raw_binary_request_deduces_the_one_input() -> None:
    """Header length 0: the body is the one input's bytes (Triton's binary data extension)."""
    fp32 = _config(
        'name: "m" max_batch_size: 4 input [ { name: "X" data_type: TYPE_FP32 dims: [ 2, -1 ] } ]'
    )
    body = np.arange(6, dtype=np.float32).tobytes()
    wire = decode_request(body, "0", "m", "", config=lambda: fp32)
    (tensor,) = wire.request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("X", "FP32", (1, 2, 3))
    np.testing.assert_array_equal(tensor.data.ravel(), np.arange(6, dtype=np.float32))
    assert wire.binary_default
    text = _config('name: "t" input [ { name: "T" data_type: TYPE_STRING dims: [ 1 ] } ]')
    (tensor,) = decode_request(b"hello", "0", "t", "", config=lambda: text).request.inputs
    assert (tensor.datatype, tensor.shape, tensor.data.tolist()) == ("BYTES", (1,), [b"hello"])
    two = _config('name: "w" input [ { name: "A" data_type: TYPE_INT8 dims: [ -1, -1 ] } ]')
    with pytest.raises(InvalidInput, match="more than one variable-sized dimension"):
        decode_request(b"ab", "0", "w", "", config=lambda: two)
