"""Every rejected request gets the right status and a message that says exactly what is wrong.

Errors are checked on the wire (raw HTTP bodies, raw gRPC messages) and through all four
tritonclient flavours; after each test the server must still serve `simple` correctly.
"""

from __future__ import annotations

import http.client
import json
import math
import struct
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcclient_aio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpclient_aio
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.serverproc import ServerProcess

HEADER_LENGTH = "Inference-Header-Content-Length"
ZEROS16 = [0] * 16


# ---- helpers ---------------------------------------------------------------------------------


def raw_post(
    server: ServerProcess, path: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection(server.http_url, timeout=30)
    try:
        conn.request("POST", path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type") or "", resp.read()
    finally:
        conn.close()


def raw_get_status(server: ServerProcess, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://{server.http_url}{path}", timeout=30) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def error_of(content_type: str, body: bytes) -> str:
    """Triton's error body is exactly {"error": "<message>"} as JSON."""
    assert content_type.startswith("application/json"), content_type
    doc = json.loads(body)
    assert list(doc) == ["error"], doc
    assert isinstance(doc["error"], str)
    return str(doc["error"])


def simple_input(
    name: str, shape: list[int], data: Any = None, datatype: str = "INT32"
) -> dict[str, Any]:
    if data is None:
        data = list(range(math.prod(shape)))
    return {"name": name, "datatype": datatype, "shape": shape, "data": data}


def simple_body(*inputs: dict[str, Any], **extra: Any) -> bytes:
    if not inputs:
        inputs = (simple_input("INPUT0", [1, 16]), simple_input("INPUT1", [1, 16], ZEROS16))
    return json.dumps({"inputs": list(inputs), **extra}).encode()


def binary_body(header: dict[str, Any], *blobs: bytes) -> tuple[bytes, dict[str, str]]:
    head = json.dumps(header).encode()
    return head + b"".join(blobs), {HEADER_LENGTH: str(len(head))}


def int32_bytes(count: int) -> bytes:
    return np.arange(count, dtype=np.int32).tobytes()


def assert_simple_serves(server: ServerProcess) -> None:
    """`simple` adds and subtracts correctly (the server survived whatever came before)."""
    a = list(range(16))
    b = [3 * i - 7 for i in range(16)]
    status, _, body = raw_post(
        server,
        "/v2/models/simple/infer",
        simple_body(simple_input("INPUT0", [1, 16], a), simple_input("INPUT1", [1, 16], b)),
    )
    assert status == 200, body
    outputs = {o["name"]: o["data"] for o in json.loads(body)["outputs"]}
    assert outputs["OUTPUT0"] == [x + y for x, y in zip(a, b, strict=True)]
    assert outputs["OUTPUT1"] == [x - y for x, y in zip(a, b, strict=True)]


@pytest.fixture(autouse=True)
def _server_survives(server: ServerProcess) -> Iterator[None]:
    yield
    assert_simple_serves(server)


# ---- raw HTTP: body-level and validation errors ----------------------------------------------


@dataclass(frozen=True)
class RawCase:
    path: str
    body: bytes
    headers: dict[str, str]
    status: int
    fragments: tuple[str, ...]


def _raw_cases() -> dict[str, RawCase]:
    infer = "/v2/models/simple/infer"
    cases: dict[str, RawCase] = {}

    def add(
        name: str,
        body: bytes,
        status: int,
        *fragments: str,
        path: str = infer,
        headers: dict[str, str] | None = None,
    ) -> None:
        cases[name] = RawCase(path, body, headers or {}, status, fragments)

    add(
        "unknown_model",
        simple_body(),
        404,
        "Request for unknown model: 'nope' is not found",
        path="/v2/models/nope/infer",
    )
    add(
        "unknown_version",
        simple_body(),
        404,
        "Request for unknown model: 'simple' version 7 is not found",
        path="/v2/models/simple/versions/7/infer",
    )
    add(
        "non_numeric_version",
        simple_body(),
        404,
        "Not Found",  # tritonserver's routes take a version of digits only
        path="/v2/models/simple/versions/latest/infer",
    )
    add(
        "missing_input",
        simple_body(simple_input("INPUT0", [1, 16])),
        400,
        "expected 2 inputs but got 1 inputs for model 'simple'",
        "missing required input(s) ['INPUT1']",
    )
    add(
        "unexpected_input",
        simple_body(
            simple_input("INPUT0", [1, 16]),
            simple_input("INPUT1", [1, 16]),
            simple_input("INPUT2", [1, 16]),
        ),
        400,
        "unexpected inference input 'INPUT2' for model 'simple'",
    )
    add(
        "duplicate_input",
        simple_body(simple_input("INPUT0", [1, 16]), simple_input("INPUT0", [1, 16])),
        400,
        "input 'INPUT0' for model 'simple' is given twice",
    )
    add(
        "wrong_datatype",
        simple_body(
            simple_input("INPUT0", [1, 16], [0.5] * 16, "FP32"), simple_input("INPUT1", [1, 16])
        ),
        400,
        "inference input 'INPUT0' data-type is 'FP32', but model 'simple' expects 'INT32'",
    )
    add(
        "unknown_datatype",
        simple_body(
            simple_input("INPUT0", [1, 16], datatype="FLOAT"), simple_input("INPUT1", [1, 16])
        ),
        400,
        "input 'INPUT0': unknown datatype 'FLOAT'",
        "expected one of BOOL",
    )
    add(
        "wrong_shape",
        simple_body(simple_input("INPUT0", [1, 15]), simple_input("INPUT1", [1, 15])),
        400,
        "unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], got [1,15]",
    )
    add(
        "missing_batch_dim",
        simple_body(simple_input("INPUT0", [16]), simple_input("INPUT1", [16])),
        400,
        "unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], got [16]",
    )
    add(
        "negative_dim",
        simple_body(simple_input("INPUT0", [-1, 16], []), simple_input("INPUT1", [1, 16])),
        400,
        "input 'INPUT0': shape [-1, 16] has a negative dimension",
    )
    add(
        "batch_too_large",
        simple_body(simple_input("INPUT0", [9, 16]), simple_input("INPUT1", [9, 16])),
        400,
        "inference request batch-size must be <= 8 for 'simple'",
    )
    add(
        "batch_zero",
        simple_body(simple_input("INPUT0", [0, 16]), simple_input("INPUT1", [0, 16])),
        400,
        "inference request batch-size must be >= 1 for 'simple', got 0",
    )
    add(
        "batch_sizes_differ",
        simple_body(simple_input("INPUT0", [1, 16]), simple_input("INPUT1", [2, 16])),
        400,
        "model 'simple': inputs have different batch sizes (1 and 2 for 'INPUT1')",
    )
    add(
        "json_too_few_elements",
        simple_body(
            simple_input("INPUT0", [1, 16], list(range(15))), simple_input("INPUT1", [1, 16])
        ),
        400,
        "input 'INPUT0': unexpected number of elements 15, expecting 16 for shape [1, 16]",
    )
    add(
        "json_too_many_elements",
        simple_body(
            simple_input("INPUT0", [1, 16]), simple_input("INPUT1", [1, 16], list(range(17)))
        ),
        400,
        "input 'INPUT1': unexpected number of elements 17, expecting 16 for shape [1, 16]",
    )
    add(
        "json_not_numbers",
        simple_body(simple_input("INPUT0", [1, 16], ["a"] * 16), simple_input("INPUT1", [1, 16])),
        400,
        "input 'INPUT0': data is not a list of INT32 values",
    )
    add(
        "json_int_out_of_range",
        simple_body(
            simple_input("INPUT0", [1, 16], [2**31, *ZEROS16[1:]]), simple_input("INPUT1", [1, 16])
        ),
        400,
        "input 'INPUT0': data is not a list of INT32 values",
        "2147483648",
    )
    add(
        "no_data",
        simple_body(
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16]},
            simple_input("INPUT1", [1, 16]),
        ),
        400,
        "input 'INPUT0': no 'data' and no binary_data_size parameter",
    )
    add(
        "shape_not_ints",
        simple_body(
            simple_input("INPUT0", [1, 16]) | {"shape": [1, "16"]}, simple_input("INPUT1", [1, 16])
        ),
        400,
        "input 'INPUT0': 'shape' must be a list of integers, got [1, '16']",
    )
    add(
        "unknown_output",
        simple_body(outputs=[{"name": "OUTPUT0"}, {"name": "OUTPUT9"}]),
        400,
        "unexpected inference output 'OUTPUT9' for model 'simple'",
    )
    add(
        "negative_class_count",
        simple_body(outputs=[{"name": "OUTPUT0", "parameters": {"classification": -1}}]),
        400,
        "output 'OUTPUT0': classification count must be >= 0, got -1",
    )
    add(
        "malformed_json",
        b'{"inputs": [{"name": "INPUT0",',
        400,
        "malformed JSON in the inference request",
    )
    add("not_utf8", b"\xff\xfe\x00", 400, "malformed JSON in the inference request")
    add("empty_body", b"", 400, "malformed JSON in the inference request")
    add("json_not_object", b"[1, 2, 3]", 400, "request body must be a JSON object")
    add(
        "no_inputs_list",
        b'{"outputs": []}',
        400,
        "inference request for model 'simple' has no 'inputs' list",
    )

    # Binary tensor data extension.
    def binary_simple(size0: int, size1: int, payload: bytes) -> tuple[bytes, dict[str, str]]:
        return binary_body(
            {
                "inputs": [
                    {
                        "name": "INPUT0",
                        "datatype": "INT32",
                        "shape": [1, 16],
                        "parameters": {"binary_data_size": size0},
                    },
                    {
                        "name": "INPUT1",
                        "datatype": "INT32",
                        "shape": [1, 16],
                        "parameters": {"binary_data_size": size1},
                    },
                ]
            },
            payload,
        )

    body, headers = binary_simple(60, 64, int32_bytes(31))
    add(
        "binary_size_mismatch",
        body,
        400,
        "input byte size mismatch for input 'INPUT0' for model 'simple'. Expected 64, got 60",
        headers=headers,
    )
    body, headers = binary_simple(64, 64, int32_bytes(25))
    add(
        "binary_size_exceeds_body",
        body,
        400,
        "input 'INPUT1': binary_data_size 64 exceeds the 36 bytes of binary data left",
        headers=headers,
    )
    body, headers = binary_simple(64, 64, int32_bytes(34))
    add(
        "binary_unclaimed",
        body,
        400,
        "inference request for model 'simple' has 8 bytes of binary data that no input claims",
        headers=headers,
    )
    body, headers = binary_simple(-4, 64, int32_bytes(32))
    add(
        "binary_size_negative",
        body,
        400,
        "input 'INPUT0': binary_data_size must be a non-negative integer",
        headers=headers,
    )
    body, _ = binary_simple(64, 64, int32_bytes(32))
    add(
        "truncated_body",
        body,
        400,
        f"inference header size should be in range (0, {len(body)}), got: 5000",
        headers={HEADER_LENGTH: "5000"},
    )
    add(
        "header_length_not_int",
        body,
        400,
        f"Unable to parse {HEADER_LENGTH}, got: abc",
        headers={HEADER_LENGTH: "abc"},
    )
    add(
        "header_length_negative",
        body,
        400,
        "inference header size should be in range (0, ",
        headers={HEADER_LENGTH: "-1"},
    )

    # BYTES length prefixes in binary data (identity_bytes, shape [1, 2]).
    def bytes_body(payload: bytes) -> tuple[bytes, dict[str, str]]:
        return binary_body(
            {
                "inputs": [
                    {
                        "name": "INPUT0",
                        "datatype": "BYTES",
                        "shape": [1, 2],
                        "parameters": {"binary_data_size": len(payload)},
                    }
                ]
            },
            payload,
        )

    bytes_infer = "/v2/models/identity_bytes/infer"
    for name, payload, fragment in (
        (
            "bytes_length_too_long",
            struct.pack("<I", 100) + b"abc",
            "incomplete string data for inference input 'INPUT0', expecting string of length "
            "100 but only 3 bytes available",
        ),
        (
            "bytes_second_length_too_long",
            struct.pack("<I", 1) + b"a" + struct.pack("<I", 9) + b"bc",
            "incomplete string data for inference input 'INPUT0', expecting string of length 9 "
            "but only 2 bytes available",
        ),
        (
            "bytes_truncated_prefix",
            struct.pack("<I", 1) + b"a" + b"\x01\x00",
            "incomplete string length indicator for inference input 'INPUT0' for model "
            "'identity_bytes', expecting 4 bytes but only 2 bytes available",
        ),
        (
            "bytes_left_over",
            struct.pack("<I", 1) + b"a" + struct.pack("<I", 1) + b"bXYZ",
            "incomplete string length indicator for inference input 'INPUT0' for model "
            "'identity_bytes', expecting 4 bytes but only 3 bytes available",
        ),
    ):
        body, headers = bytes_body(payload)
        add(
            name,
            body,
            400,
            fragment
            if fragment.startswith("incomplete")
            else f"model 'identity_bytes' input 'INPUT0': {fragment}",
            path=bytes_infer,
            headers=headers,
        )

    # Hostile inputs found by probing: each was a 500 before it got its check.
    add(
        "json_nested_too_deeply",
        b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        400,
        "nested",
    )
    huge, headers = binary_body(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "BYTES",
                    "shape": [1_000_000_000_000],
                    "parameters": {"binary_data_size": 4},
                }
            ]
        },
        b"\0\0\0\0",
    )
    add(
        "bytes_huge_shape_little_data",
        huge,
        413,  # refused on the declared shape, before decoding
        "has 1000000000000 elements, more than the limit of 33554432 per input",
        path=bytes_infer,
        headers=headers,
    )

    add(
        "unknown_endpoint",
        b"{}",
        404,
        "Not Found",
        path="/v2/models/simple/predict",
    )
    return cases


RAW_CASES = _raw_cases()


@pytest.mark.parametrize("case", list(RAW_CASES.values()), ids=list(RAW_CASES))
def test_raw_http_error(server: ServerProcess, case: RawCase) -> None:
    status, ctype, body = raw_post(server, case.path, case.body, case.headers)
    message = error_of(ctype, body)
    assert status == case.status, message
    for fragment in case.fragments:
        assert fragment in message


def test_raw_http_error_via_urllib(server: ServerProcess) -> None:
    """A plain urllib client sees the status and Triton's JSON error body too."""
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/nope/infer", data=simple_body(), method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=30)
    assert info.value.code == 404  # tritonserver: NOT_FOUND for a model it does not know
    assert json.loads(info.value.read()) == {
        "error": "Request for unknown model: 'nope' is not found"
    }


@pytest.mark.parametrize(
    ("model", "datatype", "data", "fragment"),
    [
        ("simple", "INT32", [1.5, *ZEROS16[1:]], "INT32"),
        ("simple", "INT32", ["7", *ZEROS16[1:]], "INT32"),
        ("simple", "INT32", [True, *ZEROS16[1:]], "INT32"),
        ("identity_bool", "BOOL", ["false"] + [False] * 15, "BOOL"),
        ("identity_bytes", "BYTES", [None] + ["x"] * 15, "BYTES"),
        ("identity_bytes", "BYTES", [1] + ["x"] * 15, "BYTES"),
    ],
    ids=[
        "float-for-int",
        "string-for-int",
        "bool-for-int",
        "string-for-bool",
        "null-for-bytes",
        "number-for-bytes",
    ],
)
def test_json_data_of_wrong_json_type(
    server: ServerProcess, model: str, datatype: str, data: list[Any], fragment: str
) -> None:
    """JSON values are not coerced: 1.5 is not an INT32, "false" is not a BOOL (Triton rejects
    both); silently converting them would change the data the model sees."""
    inputs = [simple_input("INPUT0", [1, 16], data, datatype)]
    if model == "simple":
        inputs.append(simple_input("INPUT1", [1, 16], ZEROS16))
    status, ctype, body = raw_post(server, f"/v2/models/{model}/infer", simple_body(*inputs))
    assert status == 400, body
    message = error_of(ctype, body)
    assert "input 'INPUT0'" in message
    assert fragment in message


# ---- tritonclient: every flavour -------------------------------------------------------------


@dataclass(frozen=True)
class ClientCase:
    inputs: tuple[tuple[str, tuple[int, ...], str], ...]
    http_status: str
    grpc_status: str
    fragments: tuple[str, ...]
    model: str = "simple"
    version: str = ""
    outputs: tuple[str, ...] = ()


SIMPLE_INPUTS = (("INPUT0", (1, 16), "INT32"), ("INPUT1", (1, 16), "INT32"))
INVALID = ("400", "StatusCode.INVALID_ARGUMENT")
CLIENT_CASES = {
    "unknown_model": ClientCase(
        SIMPLE_INPUTS,
        "404",
        "StatusCode.NOT_FOUND",
        ("Request for unknown model: 'nope' is not found",),
        model="nope",
    ),
    "unknown_version": ClientCase(
        SIMPLE_INPUTS,
        "404",
        "StatusCode.NOT_FOUND",
        ("Request for unknown model: 'simple' version 7 is not found",),
        version="7",
    ),
    "missing_input": ClientCase(
        SIMPLE_INPUTS[:1],
        *INVALID,
        (
            "expected 2 inputs but got 1 inputs for model 'simple'",
            "missing required input(s) ['INPUT1']",
        ),
    ),
    "unexpected_input": ClientCase(
        (*SIMPLE_INPUTS, ("EXTRA", (1, 16), "INT32")),
        *INVALID,
        ("unexpected inference input 'EXTRA' for model 'simple'",),
    ),
    "wrong_datatype": ClientCase(
        (("INPUT0", (1, 16), "INT32"), ("INPUT1", (1, 16), "INT64")),
        *INVALID,
        ("inference input 'INPUT1' data-type is 'INT64', but model 'simple' expects 'INT32'",),
    ),
    "wrong_shape": ClientCase(
        (("INPUT0", (1, 4, 4), "INT32"), ("INPUT1", (1, 4, 4), "INT32")),
        *INVALID,
        ("unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], got [1,4,4]",),
    ),
    "batch_too_large": ClientCase(
        (("INPUT0", (9, 16), "INT32"), ("INPUT1", (9, 16), "INT32")),
        *INVALID,
        ("inference request batch-size must be <= 8 for 'simple'",),
    ),
    "unknown_output": ClientCase(
        SIMPLE_INPUTS,
        *INVALID,
        ("unexpected inference output 'OUTPUT7' for model 'simple'",),
        outputs=("OUTPUT7",),
    ),
    "broken_model": ClientCase(
        SIMPLE_INPUTS,
        "404",
        "StatusCode.NOT_FOUND",
        (
            "Request for unknown model: 'wrong_dims' has no available versions",
            "wrong_dims/config.pbtxt",
            "dims [8]",
        ),
        model="wrong_dims",
    ),
}
NP_TYPES = {"INT32": np.int32, "INT64": np.int64}


def client_inputs(module: Any, case: ClientCase) -> list[Any]:
    inputs = []
    for name, shape, datatype in case.inputs:
        inp = module.InferInput(name, list(shape), datatype)
        inp.set_data_from_numpy(np.ones(shape, dtype=NP_TYPES[datatype]))
        inputs.append(inp)
    return inputs


def client_outputs(module: Any, case: ClientCase) -> list[Any] | None:
    return [module.InferRequestedOutput(n) for n in case.outputs] or None


def check(exc: InferenceServerException, status: str, case: ClientCase) -> None:
    assert exc.status() == status, exc
    message = exc.message()
    for fragment in case.fragments:
        assert fragment in message, message


@pytest.mark.parametrize("case", list(CLIENT_CASES.values()), ids=list(CLIENT_CASES))
@pytest.mark.parametrize("flavour", ["http", "grpc"])
def test_client_error(server: ServerProcess, flavour: str, case: ClientCase) -> None:
    if flavour == "http":
        client: Any = httpclient.InferenceServerClient(server.http_url)
        module: Any = httpclient
        status = case.http_status
    else:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        module = grpcclient
        status = case.grpc_status
    try:
        with pytest.raises(InferenceServerException) as info:
            client.infer(
                case.model,
                client_inputs(module, case),
                model_version=case.version,
                outputs=client_outputs(module, case),
            )
    finally:
        client.close()
    check(info.value, status, case)


@pytest.mark.parametrize("case", list(CLIENT_CASES.values()), ids=list(CLIENT_CASES))
@pytest.mark.parametrize("flavour", ["http_aio", "grpc_aio"])
async def test_aio_client_error(server: ServerProcess, flavour: str, case: ClientCase) -> None:
    if flavour == "http_aio":
        client: Any = httpclient_aio.InferenceServerClient(server.http_url)
        module: Any = httpclient_aio
        status = case.http_status
    else:
        client = grpcclient_aio.InferenceServerClient(server.grpc_url)
        module = grpcclient_aio
        status = case.grpc_status
    try:
        with pytest.raises(InferenceServerException) as info:
            await client.infer(
                case.model,
                client_inputs(module, case),
                model_version=case.version,
                outputs=client_outputs(module, case),
            )
    finally:
        await client.close()
    check(info.value, status, case)


# ---- raw gRPC messages -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def stub(server: ServerProcess) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    channel = grpc.insecure_channel(server.grpc_url)
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def grpc_request(
    model: str,
    datatype: str,
    shape: list[int],
    raw: bytes | None = None,
    field: str | None = None,
    values: list[Any] | None = None,
) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model)
    tensor = request.inputs.add()
    tensor.name, tensor.datatype = "INPUT0", datatype
    tensor.shape.extend(shape)
    if raw is not None:
        request.raw_input_contents.append(raw)
    if field is not None:
        getattr(tensor.contents, field).extend(values or [])
    return request


def _two_inputs_one_raw() -> service_pb2.ModelInferRequest:
    request = grpc_request("simple", "INT32", [1, 16], raw=int32_bytes(16))
    extra = request.inputs.add()
    extra.name, extra.datatype = "INPUT1", "INT32"
    extra.shape.extend([1, 16])
    return request


GRPC_CASES = {
    "raw_size_mismatch": (
        grpc_request("identity_int32", "INT32", [1, 3], raw=int32_bytes(2)),
        "StatusCode.INVALID_ARGUMENT",
        "input byte size mismatch for input 'INPUT0' for model 'identity_int32'. "
        "Expected 12, got 8",
    ),
    "raw_count_mismatch": (
        _two_inputs_one_raw(),
        "StatusCode.INVALID_ARGUMENT",
        "unable to find data for input tensor 'INPUT1' for model 'simple' in request.",
    ),
    "contents_count_mismatch": (
        grpc_request("identity_int8", "INT8", [1, 3], field="int_contents", values=[1, 2]),
        "StatusCode.INVALID_ARGUMENT",
        "unexpected number of elements 2 in contents.int_contents, expecting 3 for shape [1, 3]",
    ),
    "contents_wrong_field": (
        grpc_request("identity_int64", "INT64", [1, 2], field="int_contents", values=[1, 2]),
        "StatusCode.INVALID_ARGUMENT",
        "unexpected number of elements 0 in contents.int64_contents, expecting 2",
    ),
    "contents_int8_out_of_range": (
        grpc_request("identity_int8", "INT8", [1, 2], field="int_contents", values=[300, -1]),
        "StatusCode.INVALID_ARGUMENT",
        "input 'INPUT0'",
    ),
    "contents_uint8_out_of_range": (
        grpc_request("identity_uint8", "UINT8", [1, 2], field="uint_contents", values=[256, 1]),
        "StatusCode.INVALID_ARGUMENT",
        "input 'INPUT0'",
    ),
    "bytes_length_too_long": (
        grpc_request("identity_bytes", "BYTES", [1, 2], raw=struct.pack("<I", 5) + b"abc"),
        "StatusCode.INVALID_ARGUMENT",
        "incomplete string data for inference input 'INPUT0', expecting string of length 5 but "
        "only 3 bytes available",
    ),
    "bytes_truncated_prefix": (
        grpc_request("identity_bytes", "BYTES", [1, 2], raw=struct.pack("<I", 1) + b"a\x01"),
        "StatusCode.INVALID_ARGUMENT",
        "incomplete string length indicator for inference input 'INPUT0' for model "
        "'identity_bytes', expecting 4 bytes but only 1 bytes available",
    ),
    "bytes_left_over": (
        grpc_request("identity_bytes", "BYTES", [1, 1], raw=struct.pack("<I", 1) + b"ab"),
        "StatusCode.INVALID_ARGUMENT",
        "incomplete string length indicator for inference input 'INPUT0' for model "
        "'identity_bytes', expecting 4 bytes but only 1 bytes available",
    ),
    "unknown_datatype": (
        grpc_request("identity_int8", "FLOAT", [1, 2], raw=b"12"),
        "StatusCode.INVALID_ARGUMENT",
        "input 'INPUT0': unknown datatype 'FLOAT'",
    ),
    "negative_dim": (
        grpc_request("identity_int8", "INT8", [1, -2], raw=b"12"),
        "StatusCode.INVALID_ARGUMENT",
        "input 'INPUT0': shape [1, -2] has a negative dimension",
    ),
    "raw_and_contents": (
        grpc_request(
            "identity_int32", "INT32", [1, 2], raw=b"\0" * 8, field="int_contents", values=[1, 2]
        ),
        "StatusCode.INVALID_ARGUMENT",
        "contents field must not be specified when using raw_input_contents for 'INPUT0'",
    ),
    "non_numeric_version": (
        service_pb2.ModelInferRequest(model_name="simple", model_version="x"),
        "StatusCode.INVALID_ARGUMENT",
        "version string 'x', version should be an integral value > 0",
    ),
}


@pytest.mark.parametrize(
    ("request_msg", "code", "fragment"), list(GRPC_CASES.values()), ids=list(GRPC_CASES)
)
def test_raw_grpc_error(
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
    request_msg: service_pb2.ModelInferRequest,
    code: str,
    fragment: str,
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request_msg, timeout=30)
    assert str(info.value.code()) == code, info.value.details()
    assert fragment in info.value.details()


# ---- models that failed to load --------------------------------------------------------------

BROKEN = {
    "broken_model_file": ("broken_model_file/1/model.onnx", "onnxruntime cannot load"),
    "broken_config": ("broken_config/config.pbtxt", "max_batch_size"),
    "wrong_dims": ("wrong_dims/config.pbtxt", "input 'INPUT0'", "dims [8]"),
}


def index_entries(index: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    entries = [e for e in index if e["name"] == name]
    assert entries, f"{name} missing from the repository index"
    return entries


@pytest.mark.parametrize("name", list(BROKEN))
def test_broken_model_in_http_index(server: ServerProcess, name: str) -> None:
    status, _, body = raw_post(server, "/v2/repository/index", b"{}")
    assert status == 200
    index = json.loads(body)
    for entry in index_entries(index, name):
        assert entry["state"] == "UNAVAILABLE"
        for fragment in BROKEN[name]:
            assert fragment in entry["reason"]
    # The working models next to it are listed READY.
    assert [e["state"] for e in index_entries(index, "simple")] == ["READY"]
    # ready=true leaves the broken model out.
    status, _, body = raw_post(server, "/v2/repository/index", b'{"ready": true}')
    assert status == 200
    assert name not in {e["name"] for e in json.loads(body)}


@pytest.mark.parametrize("name", list(BROKEN))
def test_broken_model_in_grpc_index(server: ServerProcess, name: str) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        index = client.get_model_repository_index(as_json=True)["models"]
    finally:
        client.close()
    for entry in index_entries(index, name):
        assert entry["state"] == "UNAVAILABLE"
        for fragment in BROKEN[name]:
            assert fragment in entry["reason"]


@pytest.mark.parametrize("name", list(BROKEN))
def test_broken_model_not_ready(server: ServerProcess, name: str) -> None:
    assert raw_get_status(server, f"/v2/models/{name}/ready") == 400
    assert raw_get_status(server, "/v2/models/simple/ready") == 200
    # Broken models do not make the server itself unready.
    assert raw_get_status(server, "/v2/health/ready") == 200
    hclient = httpclient.InferenceServerClient(server.http_url)
    gclient = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        assert hclient.is_model_ready(name) is False
        assert gclient.is_model_ready(name) is False
        assert gclient.is_model_ready("simple") is True
    finally:
        hclient.close()
        gclient.close()


@pytest.mark.parametrize("name", list(BROKEN))
def test_broken_model_infer_unavailable(server: ServerProcess, name: str) -> None:
    status, ctype, body = raw_post(server, f"/v2/models/{name}/infer", simple_body())
    message = error_of(ctype, body)
    assert status == 404, message
    assert f"Request for unknown model: '{name}' has no available versions" in message
    for fragment in BROKEN[name]:
        assert fragment in message
    client = grpcclient.InferenceServerClient(server.grpc_url)
    case = ClientCase(SIMPLE_INPUTS, "", "", ())
    try:
        with pytest.raises(InferenceServerException) as info:
            client.infer(name, client_inputs(grpcclient, case))
    finally:
        client.close()
    assert info.value.status() == "StatusCode.NOT_FOUND"
    for fragment in (f"'{name}' has no available versions", *BROKEN[name]):
        assert fragment in info.value.message()


# ---- still serving, in every flavour ---------------------------------------------------------


def _simple_arrays() -> tuple[np.ndarray, np.ndarray]:
    a = np.arange(32, dtype=np.int32).reshape(2, 16) - 5
    b = np.full((2, 16), 2**30, dtype=np.int32)
    return a, b


def _simple_inputs(module: Any) -> list[Any]:
    inputs = []
    for name, array in zip(("INPUT0", "INPUT1"), _simple_arrays(), strict=True):
        inp = module.InferInput(name, [2, 16], "INT32")
        inp.set_data_from_numpy(array)
        inputs.append(inp)
    return inputs


def _check_simple(result: Any) -> None:
    a, b = _simple_arrays()
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_sync_clients_still_served(server: ServerProcess) -> None:
    hclient = httpclient.InferenceServerClient(server.http_url)
    gclient = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        _check_simple(hclient.infer("simple", _simple_inputs(httpclient)))
        _check_simple(gclient.infer("simple", _simple_inputs(grpcclient)))
    finally:
        hclient.close()
        gclient.close()


async def test_aio_clients_still_served(server: ServerProcess) -> None:
    hclient = httpclient_aio.InferenceServerClient(server.http_url)
    gclient = grpcclient_aio.InferenceServerClient(server.grpc_url)
    try:
        _check_simple(await hclient.infer("simple", _simple_inputs(httpclient_aio)))
        _check_simple(await gclient.infer("simple", _simple_inputs(grpcclient_aio)))
    finally:
        await hclient.close()
        await gclient.close()
