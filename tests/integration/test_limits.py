"""Input limits: elements per input, tensor bytes per request, header sizes. Over a limit a
request gets 413 / RESOURCE_EXHAUSTED (400 for headers) naming the model, the input, the limit
and the flag that raises it; the server keeps serving. (Batch size and JSON nesting limits are
covered in test_errors.py.)"""

from __future__ import annotations

import http.client
import json
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from configs.generate import identity_model, save
from tests.integration.models import CONFIG_TYPES, ONNX_TYPES
from tests.serverproc import ServerProcess

MAX_ELEMENTS = 1000
MAX_BYTES = 6000
MAX_HEADER = 1024


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("limits")
    for datatype in ("FP32", "FP64", "BYTES"):
        name = f"identity_{datatype.lower()}"
        save(identity_model(ONNX_TYPES[datatype], ["batch", "n"]), root / name / "1" / "model.onnx")
        (root / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
            f'input [ {{ name: "INPUT0", data_type: {CONFIG_TYPES[datatype]}, dims: [ -1 ] }} ]\n'
            f'output [ {{ name: "OUTPUT0", data_type: {CONFIG_TYPES[datatype]}, dims: [ -1 ] }} ]\n'
        )
    proc = ServerProcess(
        root,
        f"--max-tensor-elements={MAX_ELEMENTS}",
        f"--max-request-tensor-bytes={MAX_BYTES}",
        f"--max-request-header-bytes={MAX_HEADER}",
        "--max-request-headers=20",
        log_path=tmp_path_factory.mktemp("logs") / "server.log",
    )
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def _http_error(proc: ServerProcess, model: str, array: np.ndarray, datatype: str, binary: bool):  # type: ignore[no-untyped-def]
    client = httpclient.InferenceServerClient(proc.http_url)
    inp = httpclient.InferInput("INPUT0", list(array.shape), datatype)
    inp.set_data_from_numpy(array, binary_data=binary)
    with pytest.raises(InferenceServerException) as info:
        client.infer(model, [inp])
    return info.value


def _grpc_error(proc: ServerProcess, model: str, array: np.ndarray, datatype: str):  # type: ignore[no-untyped-def]
    client = grpcclient.InferenceServerClient(proc.grpc_url)
    inp = grpcclient.InferInput("INPUT0", list(array.shape), datatype)
    inp.set_data_from_numpy(array)
    with pytest.raises(InferenceServerException) as info:
        client.infer(model, [inp])
    return info.value


def _still_serves(proc: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(proc.http_url)
    inp = httpclient.InferInput("INPUT0", [1, MAX_ELEMENTS], "FP32")  # exactly at the limit
    data = np.arange(MAX_ELEMENTS, dtype=np.float32).reshape(1, -1)
    inp.set_data_from_numpy(data)
    np.testing.assert_array_equal(client.infer("identity_fp32", [inp]).as_numpy("OUTPUT0"), data)


ELEMENTS_MESSAGE = (
    "model 'identity_fp32' input 'INPUT0': shape [1, 1001] has 1001 elements, more than the "
    f"limit of {MAX_ELEMENTS} per input (raise it with --max-tensor-elements)"
)


@pytest.mark.parametrize("binary", [True, False])
def test_http_input_over_element_limit_is_413(limited: ServerProcess, binary: bool) -> None:
    error = _http_error(
        limited, "identity_fp32", np.ones((1, MAX_ELEMENTS + 1), np.float32), "FP32", binary
    )
    assert error.status() == "413"
    assert error.message() == ELEMENTS_MESSAGE
    _still_serves(limited)


def test_grpc_input_over_element_limit_is_resource_exhausted(limited: ServerProcess) -> None:
    error = _grpc_error(
        limited, "identity_fp32", np.ones((1, MAX_ELEMENTS + 1), np.float32), "FP32"
    )
    assert error.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert error.message() == ELEMENTS_MESSAGE
    _still_serves(limited)


def test_request_over_tensor_byte_limit(limited: ServerProcess) -> None:
    array = np.ones((1, 900), np.float64)  # 900 elements, 7200 bytes
    expected = (
        "model 'identity_fp64' input 'INPUT0': the request's tensors reach 7200 bytes, more "
        f"than the limit of {MAX_BYTES} per request (raise it with --max-request-tensor-bytes)"
    )
    error = _http_error(limited, "identity_fp64", array, "FP64", True)
    assert (error.status(), error.message()) == ("413", expected)
    error = _grpc_error(limited, "identity_fp64", array, "FP64")
    assert (error.status(), error.message()) == ("StatusCode.RESOURCE_EXHAUSTED", expected)


def test_bytes_input_with_a_hostile_shape_is_refused_before_decoding(
    limited: ServerProcess,
) -> None:
    """Eight bytes of data declaring a billion BYTES elements: refused on the declared shape."""
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "BYTES",
                    "shape": [1, 10**9],
                    "parameters": {"binary_data_size": 8},
                }
            ]
        }
    ).encode()
    body = header + struct.pack("<I", 4) + b"abcd"
    conn = http.client.HTTPConnection(limited.http_url, timeout=30)
    conn.request(
        "POST",
        "/v2/models/identity_bytes/infer",
        body,
        {"Inference-Header-Content-Length": str(len(header))},
    )
    response = conn.getresponse()
    assert response.status == 413
    assert json.loads(response.read())["error"] == (
        "model 'identity_bytes' input 'INPUT0': shape [1, 1000000000] has 1000000000 elements, "
        f"more than the limit of {MAX_ELEMENTS} per input (raise it with --max-tensor-elements)"
    )


def test_grpc_bytes_input_with_a_hostile_shape_is_refused_before_decoding(
    limited: ServerProcess,
) -> None:
    """The same over gRPC, with a raw ModelInferRequest: tritonclient would refuse to build it."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    request = service_pb2.ModelInferRequest(model_name="identity_bytes")
    tensor = request.inputs.add(name="INPUT0", datatype="BYTES")
    tensor.shape.extend([1, 10**9])
    request.raw_input_contents.append(struct.pack("<I", 4) + b"abcd")
    with grpc.insecure_channel(limited.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "shape [1, 1000000000] has 1000000000 elements" in (info.value.details() or "")


def _raw_request(proc: ServerProcess, headers: dict[str, str]) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(proc.http_url, timeout=30)
    conn.request("GET", "/v2/health/ready", headers=headers)
    response = conn.getresponse()
    return response.status, response.read()


def test_header_over_size_limit_is_400(limited: ServerProcess) -> None:
    status, body = _raw_request(limited, {"X-Big": "a" * (MAX_HEADER + 1)})
    assert status == 400
    assert b"Got more than 1024 bytes" in body
    assert _raw_request(limited, {"X-Big": "a" * (MAX_HEADER // 2)})[0] == 200
    _still_serves(limited)


def test_too_many_headers_is_400(limited: ServerProcess) -> None:
    status, body = _raw_request(limited, {f"X-H{i}": "1" for i in range(30)})
    assert status == 400
    assert b"Too many headers" in body
    _still_serves(limited)


def test_limits_do_not_apply_below_them(limited: ServerProcess, tmp_path: Path) -> None:
    _still_serves(limited)
    client = grpcclient.InferenceServerClient(limited.grpc_url)
    inp = grpcclient.InferInput("INPUT0", [1, 3], "BYTES")
    data = np.array([[b"a", b"bc", b""]], dtype=np.object_)
    inp.set_data_from_numpy(data)
    assert client.infer("identity_bytes", [inp]).as_numpy("OUTPUT0").tolist() == data.tolist()


@pytest.mark.parametrize("route", ["infer", "load"])
def test_a_body_over_max_request_bytes_is_413_in_tritonservers_words(  # type: ignore[no-untyped-def]
    start_server, tmp_path: Path, route: str
) -> None:
    """The infer route (httptools) and aiohttp's routes (a model load with a file override, as
    Triton's L0_http test_loading_large_invalid_model) refuse it alike."""
    repo = tmp_path / "empty"
    repo.mkdir()
    proc = start_server(repo, "--max-request-bytes=4096", "--model-control-mode=explicit")
    path = "/v2/models/m/infer" if route == "infer" else "/v2/repository/models/m/load"
    body = json.dumps({"parameters": {"file:1/model.onnx": "A" * 8192}}).encode()
    conn = http.client.HTTPConnection(proc.http_url, timeout=30)
    conn.request("POST", path, body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 413
    error = json.loads(response.read())["error"]
    assert error.startswith("request JSON size exceeds the maximum allowed input size: ")
    assert "4096" in error
    assert "--max-request-bytes" in error
