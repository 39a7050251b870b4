"""Every Triton datatype round-trips exactly through the real server, over every protocol.

The `identity_<dtype>` models (dims [-1], max_batch_size 8) return their input unchanged, so
whatever comes back must be bit-for-bit what went in: extremes of every integer type, float
extremes and subnormals, NaN / +Inf / -Inf, and BYTES with empty, unicode and non-UTF-8 items.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcclient_aio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpclient_aio
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException, deserialize_bytes_tensor

from tests.integration.models import ONNX_TYPES, identity_name
from tests.serverproc import ServerProcess

DATATYPES = list(ONNX_TYPES)
FLOATS = ["FP16", "FP32", "FP64"]
NUMPY = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BYTES": np.object_,
}
# Typed `contents` field of InferTensorContents per datatype (FP16 has none).
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
ASYNC_SUBSET = ["BOOL", "UINT64", "INT8", "FP16", "FP64", "BYTES"]

# BYTES for binary transports: empty, unicode, NUL and control bytes, long items. Non-UTF-8
# items cannot reach an ONNX string tensor and are rejected (see test_bytes_non_utf8_*).
RAW_BYTES = [
    b"",
    "h\u00e9llo \u2713 \U0001f600".encode(),
    b"\x00",
    b"\x01\x02\x7f\x00mid",
    b"a" * 1000,
    b"end\x00",
]
NON_UTF8 = b"\xff\xfe\x80"
# BYTES that JSON can carry (valid UTF-8 strings), still with empty and unicode items.
JSON_BYTES = [
    "",
    "h\u00e9llo \u2713 \U0001f600",
    "\u65e5\u672c\u8a9e",
    'tab\tquote"back\\slash',
    "a" * 300,
    "x",
]


def sample(datatype: str, json_safe: bool = False) -> np.ndarray:
    """A [2, 3] array exercising the extremes of `datatype`."""
    dtype = np.dtype(NUMPY[datatype])
    if datatype == "BOOL":
        values: list[Any] = [True, False, True, False, False, True]
    elif datatype == "BYTES":
        items = [s.encode() for s in JSON_BYTES] if json_safe else RAW_BYTES
        array = np.empty(6, dtype=np.object_)
        array[:] = items
        return array.reshape(2, 3)
    elif dtype.kind == "u":
        info = np.iinfo(dtype)
        values = [0, info.max, 1, info.max - 1, 2 ** (info.bits - 1), 42]
    elif dtype.kind == "i":
        info = np.iinfo(dtype)
        values = [info.min, info.max, -1, 0, 1, info.min + 1]
    else:
        finfo = np.finfo(dtype)
        values = [finfo.min, finfo.max, finfo.tiny, finfo.smallest_subnormal, -0.0, np.pi]
    return np.array(values, dtype=dtype).reshape(2, 3)


def nonfinite(datatype: str) -> np.ndarray:
    return np.array([[np.nan, np.inf, -np.inf], [-0.0, 1.0, np.nan]], dtype=NUMPY[datatype])


def assert_identical(got: np.ndarray, expected: np.ndarray) -> None:
    """Same shape, dtype and bits (NaN included); BYTES compare item by item."""
    assert got.shape == expected.shape
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
    if expected.dtype == np.object_:
        assert got.tolist() == expected.tolist()
    else:
        assert got.tobytes() == expected.tobytes(), (got, expected)


def assert_nonfinite(got: np.ndarray, expected: np.ndarray) -> None:
    assert got.shape == expected.shape
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(expected))
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(expected))
    np.testing.assert_array_equal(
        np.signbit(got[~np.isnan(got)]), np.signbit(expected[~np.isnan(expected)])
    )
    np.testing.assert_array_equal(got, expected)  # NaN == NaN here


def as_str(array: np.ndarray) -> np.ndarray:
    """What tritonclient.http gives back for BYTES sent as JSON: str items."""
    out = np.empty(array.size, dtype=np.object_)
    out[:] = [b.decode() for b in array.ravel()]
    return out.reshape(array.shape)


# ---- clients ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.http_url)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc_client(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


@pytest.fixture(scope="module")
def stub(server: ServerProcess) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    channel = grpc.insecure_channel(server.grpc_url)
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def http_infer(
    client: httpclient.InferenceServerClient,
    model: str,
    array: np.ndarray,
    datatype: str,
    binary_in: bool,
    binary_out: bool,
    class_count: int = 0,
) -> tuple[np.ndarray, dict[str, Any]]:
    inp = httpclient.InferInput("INPUT0", list(array.shape), datatype)
    inp.set_data_from_numpy(array, binary_data=binary_in)
    out = httpclient.InferRequestedOutput(
        "OUTPUT0", binary_data=binary_out, class_count=class_count
    )
    result = client.infer(model, [inp], outputs=[out])
    output = result.get_output("OUTPUT0")
    # The response really used the wire format that was asked for.
    if binary_out:
        assert "data" not in output
        assert output["parameters"]["binary_data_size"] >= 0
    else:
        assert "data" in output
    return result.as_numpy("OUTPUT0"), output


def grpc_infer(
    client: grpcclient.InferenceServerClient,
    model: str,
    array: np.ndarray,
    datatype: str,
    class_count: int = 0,
) -> tuple[np.ndarray, Any]:
    inp = grpcclient.InferInput("INPUT0", list(array.shape), datatype)
    inp.set_data_from_numpy(array)
    out = grpcclient.InferRequestedOutput("OUTPUT0", class_count=class_count)
    result = client.infer(model, [inp], outputs=[out])
    return result.as_numpy("OUTPUT0"), result.get_output("OUTPUT0")


# ---- round trips -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("binary_in", "binary_out"),
    [(False, False), (True, True), (False, True), (True, False)],
    ids=["json", "binary", "json-in-binary-out", "binary-in-json-out"],
)
@pytest.mark.parametrize("datatype", DATATYPES)
def test_http_round_trip(
    http: httpclient.InferenceServerClient, datatype: str, binary_in: bool, binary_out: bool
) -> None:
    json_safe = datatype == "BYTES" and not (binary_in and binary_out)
    array = sample(datatype, json_safe=json_safe)
    got, output = http_infer(http, identity_name(datatype), array, datatype, binary_in, binary_out)
    assert output["datatype"] == datatype
    assert output["shape"] == [2, 3]
    if datatype == "BYTES" and not binary_out:
        array = as_str(array)
    assert_identical(got, array)


@pytest.mark.parametrize("datatype", DATATYPES)
def test_grpc_round_trip(grpc_client: grpcclient.InferenceServerClient, datatype: str) -> None:
    array = sample(datatype)
    got, output = grpc_infer(grpc_client, identity_name(datatype), array, datatype)
    assert output.datatype == datatype
    assert list(output.shape) == [2, 3]
    assert_identical(got, array)


@pytest.mark.parametrize("datatype", ASYNC_SUBSET)
async def test_http_aio_round_trip(server: ServerProcess, datatype: str) -> None:
    array = sample(datatype)
    client = httpclient_aio.InferenceServerClient(server.http_url)
    try:
        inp = httpclient_aio.InferInput("INPUT0", [2, 3], datatype)
        inp.set_data_from_numpy(array, binary_data=True)
        out = httpclient_aio.InferRequestedOutput("OUTPUT0", binary_data=True)
        result = await client.infer(identity_name(datatype), [inp], outputs=[out])
    finally:
        await client.close()
    assert result.get_output("OUTPUT0")["datatype"] == datatype
    assert_identical(result.as_numpy("OUTPUT0"), array)


@pytest.mark.parametrize("datatype", ASYNC_SUBSET)
async def test_http_aio_json_round_trip(server: ServerProcess, datatype: str) -> None:
    array = sample(datatype, json_safe=True)
    client = httpclient_aio.InferenceServerClient(server.http_url)
    try:
        inp = httpclient_aio.InferInput("INPUT0", [2, 3], datatype)
        inp.set_data_from_numpy(array, binary_data=False)
        out = httpclient_aio.InferRequestedOutput("OUTPUT0", binary_data=False)
        result = await client.infer(identity_name(datatype), [inp], outputs=[out])
    finally:
        await client.close()
    expected = as_str(array) if datatype == "BYTES" else array
    assert_identical(result.as_numpy("OUTPUT0"), expected)


@pytest.mark.parametrize("datatype", ASYNC_SUBSET)
async def test_grpc_aio_round_trip(server: ServerProcess, datatype: str) -> None:
    array = sample(datatype)
    client = grpcclient_aio.InferenceServerClient(server.grpc_url)
    try:
        inp = grpcclient_aio.InferInput("INPUT0", [2, 3], datatype)
        inp.set_data_from_numpy(array)
        result = await client.infer(identity_name(datatype), [inp])
    finally:
        await client.close()
    assert result.get_output("OUTPUT0").datatype == datatype
    assert_identical(result.as_numpy("OUTPUT0"), array)


def non_utf8_array() -> np.ndarray:
    array = np.empty(6, dtype=np.object_)
    array[:] = [b"ok", b"", b"x", NON_UTF8, b"y", b"z"]
    return array.reshape(2, 3)


def test_bytes_non_utf8_http_binary_is_rejected(http: httpclient.InferenceServerClient) -> None:
    """The transport carries any bytes, but ONNX string tensors hold UTF-8: a clear 400."""
    inp = httpclient.InferInput("INPUT0", [2, 3], "BYTES")
    inp.set_data_from_numpy(non_utf8_array(), binary_data=True)
    with pytest.raises(InferenceServerException) as info:
        http.infer("identity_bytes", [inp])
    assert info.value.status() == "400"
    assert "input 'INPUT0' element 3 is not valid UTF-8" in info.value.message()


def test_bytes_non_utf8_grpc_is_rejected(grpc_client: grpcclient.InferenceServerClient) -> None:
    inp = grpcclient.InferInput("INPUT0", [2, 3], "BYTES")
    inp.set_data_from_numpy(non_utf8_array())
    with pytest.raises(InferenceServerException) as info:
        grpc_client.infer("identity_bytes", [inp])
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "input 'INPUT0' element 3 is not valid UTF-8" in info.value.message()


# ---- NaN and infinities ----------------------------------------------------------------------


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("datatype", FLOATS)
def test_http_nonfinite(
    http: httpclient.InferenceServerClient, datatype: str, binary: bool
) -> None:
    array = nonfinite(datatype)
    got, _ = http_infer(http, identity_name(datatype), array, datatype, binary, binary)
    assert_nonfinite(got, array)


@pytest.mark.parametrize("datatype", FLOATS)
def test_http_nonfinite_json_body_uses_nan_tokens(server: ServerProcess, datatype: str) -> None:
    """Triton writes NaN / Infinity / -Infinity in JSON, never null (which would lose them)."""
    import http.client
    import json

    body = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": datatype,
                    "shape": [1, 3],
                    "data": [float("nan"), float("inf"), float("-inf")],
                }
            ]
        }
    )
    assert "NaN" in body
    conn = http.client.HTTPConnection(server.http_url, timeout=30)
    try:
        conn.request("POST", f"/v2/models/{identity_name(datatype)}/infer", body=body)
        resp = conn.getresponse()
        text = resp.read().decode()
    finally:
        conn.close()
    assert resp.status == 200, text
    assert "null" not in text
    assert '"data":[NaN,Infinity,-Infinity]' in text.replace(" ", "")


@pytest.mark.parametrize("datatype", FLOATS)
def test_grpc_nonfinite(grpc_client: grpcclient.InferenceServerClient, datatype: str) -> None:
    array = nonfinite(datatype)
    got, _ = grpc_infer(grpc_client, identity_name(datatype), array, datatype)
    assert_nonfinite(got, array)


@pytest.mark.parametrize("datatype", ["FP16", "FP64"])
async def test_aio_nonfinite(server: ServerProcess, datatype: str) -> None:
    array = nonfinite(datatype)
    hclient = httpclient_aio.InferenceServerClient(server.http_url)
    gclient = grpcclient_aio.InferenceServerClient(server.grpc_url)
    try:
        hinp = httpclient_aio.InferInput("INPUT0", [2, 3], datatype)
        hinp.set_data_from_numpy(array, binary_data=False)
        hout = httpclient_aio.InferRequestedOutput("OUTPUT0", binary_data=False)
        hresult = await hclient.infer(identity_name(datatype), [hinp], outputs=[hout])
        ginp = grpcclient_aio.InferInput("INPUT0", [2, 3], datatype)
        ginp.set_data_from_numpy(array)
        gresult = await gclient.infer(identity_name(datatype), [ginp])
    finally:
        await hclient.close()
        await gclient.close()
    assert_nonfinite(hresult.as_numpy("OUTPUT0"), array)
    assert_nonfinite(gresult.as_numpy("OUTPUT0"), array)


# ---- gRPC typed contents ---------------------------------------------------------------------


def contents_request(datatype: str, array: np.ndarray) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=identity_name(datatype))
    tensor = request.inputs.add()
    tensor.name = "INPUT0"
    tensor.datatype = datatype
    tensor.shape.extend(array.shape)
    getattr(tensor.contents, CONTENTS_FIELD[datatype]).extend(array.ravel().tolist())
    return request


def decode_output(response: service_pb2.ModelInferResponse, datatype: str) -> np.ndarray:
    assert len(response.outputs) == 1
    assert len(response.raw_output_contents) == 1
    output = response.outputs[0]
    assert output.name == "OUTPUT0"
    assert output.datatype == datatype
    raw = response.raw_output_contents[0]
    if datatype == "BYTES":
        array = deserialize_bytes_tensor(raw)
    else:
        array = np.frombuffer(raw, dtype=NUMPY[datatype])
    return array.reshape(tuple(output.shape))


@pytest.mark.parametrize("datatype", list(CONTENTS_FIELD))
def test_grpc_typed_contents(
    stub: service_pb2_grpc.GRPCInferenceServiceStub, datatype: str
) -> None:
    array = sample(datatype)
    response = stub.ModelInfer(contents_request(datatype, array), timeout=30)
    assert response.model_name == identity_name(datatype)
    assert_identical(decode_output(response, datatype), array)


@pytest.mark.parametrize("datatype", ["FP32", "FP64"])
def test_grpc_typed_contents_nonfinite(
    stub: service_pb2_grpc.GRPCInferenceServiceStub, datatype: str
) -> None:
    array = nonfinite(datatype)
    response = stub.ModelInfer(contents_request(datatype, array), timeout=30)
    assert_nonfinite(decode_output(response, datatype), array)


def test_grpc_typed_contents_fp16_is_rejected(
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    """FP16 has no typed contents field; the server says to use raw_input_contents."""
    request = service_pb2.ModelInferRequest(model_name="identity_fp16")
    tensor = request.inputs.add()
    tensor.name, tensor.datatype = "INPUT0", "FP16"
    tensor.shape.extend([1, 2])
    tensor.contents.fp32_contents.extend([1.0, 2.0])
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "FP16 must be sent in raw_input_contents" in info.value.details()


# ---- classification extension ----------------------------------------------------------------

CLASSIFIER_INPUT = np.array(
    [[0.1, 0.5, 0.2, 0.9, 0.3], [0.75, -1.0, 2.5, 0.0, 0.25]], dtype=np.float32
)
CLASSIFIED = [
    [b"0.900000:3:fish", b"0.500000:1:dog"],
    [b"2.500000:2:bird", b"0.750000:0:cat"],
]


@pytest.mark.parametrize("binary_out", [False, True], ids=["json", "binary"])
def test_http_classification(http: httpclient.InferenceServerClient, binary_out: bool) -> None:
    got, output = http_infer(
        http, "classifier", CLASSIFIER_INPUT, "FP32", True, binary_out, class_count=2
    )
    assert output["datatype"] == "BYTES"
    assert output["shape"] == [2, 2]
    items = [[x if isinstance(x, bytes) else x.encode() for x in row] for row in got.tolist()]
    assert items == CLASSIFIED


def test_grpc_classification(grpc_client: grpcclient.InferenceServerClient) -> None:
    got, output = grpc_infer(grpc_client, "classifier", CLASSIFIER_INPUT, "FP32", class_count=2)
    assert output.datatype == "BYTES"
    assert list(output.shape) == [2, 2]
    assert got.tolist() == CLASSIFIED


async def test_grpc_aio_classification_all_classes(server: ServerProcess) -> None:
    """class_count larger than the number of classes gives every class, best first."""
    client = grpcclient_aio.InferenceServerClient(server.grpc_url)
    try:
        inp = grpcclient_aio.InferInput("INPUT0", [1, 5], "FP32")
        inp.set_data_from_numpy(CLASSIFIER_INPUT[:1])
        out = grpcclient_aio.InferRequestedOutput("OUTPUT0", class_count=10)
        result = await client.infer("classifier", [inp], outputs=[out])
    finally:
        await client.close()
    assert result.as_numpy("OUTPUT0").tolist() == [
        [
            b"0.900000:3:fish",
            b"0.500000:1:dog",
            b"0.300000:4:frog",
            b"0.200000:2:bird",
            b"0.100000:0:cat",
        ]
    ]


# ---- reshape ---------------------------------------------------------------------------------

RESHAPE_INPUT = np.arange(-16, 16, dtype=np.float32).reshape(2, 16) * np.float32(1.25)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_http_reshape(http: httpclient.InferenceServerClient, binary: bool) -> None:
    got, output = http_infer(http, "reshaped", RESHAPE_INPUT, "FP32", binary, binary)
    assert output["shape"] == [2, 16]
    assert_identical(got, RESHAPE_INPUT)


def test_grpc_reshape(grpc_client: grpcclient.InferenceServerClient) -> None:
    got, output = grpc_infer(grpc_client, "reshaped", RESHAPE_INPUT, "FP32")
    assert list(output.shape) == [2, 16]
    assert_identical(got, RESHAPE_INPUT)


def test_reshape_metadata_shows_config_dims(http: httpclient.InferenceServerClient) -> None:
    meta = http.get_model_metadata("reshaped")
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]}]
    assert meta["outputs"] == [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 16]}]


def test_reshape_rejects_model_shape(http: httpclient.InferenceServerClient) -> None:
    """Clients see dims [16]; the model's own [4, 4] is not accepted on the wire."""
    array = np.zeros((1, 4, 4), dtype=np.float32)
    inp = httpclient.InferInput("INPUT0", [1, 4, 4], "FP32")
    inp.set_data_from_numpy(array)
    with pytest.raises(InferenceServerException) as info:
        http.infer("reshaped", [inp])
    assert info.value.status() == "400"
    assert "Expected [-1,16], got [1,4,4]" in info.value.message()
