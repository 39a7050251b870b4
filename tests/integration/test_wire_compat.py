"""Wire details as tritonserver sends them: outputs written to shared memory carry no
`parameters`, a zero-element output over every encoding, the raw binary request."""

from __future__ import annotations

import json
import struct
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

from tests.serverproc import ServerProcess

HEADER_LENGTH = "Inference-Header-Content-Length"
BYTES = 16 * 4


def _post(server: ServerProcess, model: str, body: bytes, headers: dict[str, str]) -> Any:
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/{model}/infer", data=body, headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


@pytest.fixture
def out_region(server: ServerProcess) -> Iterator[str]:
    tag = uuid.uuid4().hex[:8]
    handle = shm.create_shared_memory_region(f"wire-{tag}", f"/wire_{tag}", BYTES * 2)
    client = httpclient.InferenceServerClient(server.http_url)
    client.register_system_shared_memory(f"wire-{tag}", f"/wire_{tag}", BYTES * 2)
    yield f"wire-{tag}"
    client.unregister_system_shared_memory(f"wire-{tag}")
    shm.destroy_shared_memory_region(handle)


def test_http_outputs_in_shared_memory_carry_name_datatype_and_shape_only(
    server: ServerProcess, out_region: str
) -> None:
    """Triton's C++ client (perf_analyzer's) reads any output `parameters` as binary data."""
    doc = {
        "inputs": [
            {"name": n, "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
            for n in ("INPUT0", "INPUT1")
        ],
        "outputs": [
            {
                "name": name,
                "parameters": {
                    "shared_memory_region": out_region,
                    "shared_memory_byte_size": BYTES,
                    "shared_memory_offset": offset,
                },
            }
            for name, offset in (("OUTPUT0", 0), ("OUTPUT1", BYTES))
        ],
    }
    status, headers, body = _post(server, "simple", json.dumps(doc).encode(), {})
    assert status == 200, body
    assert HEADER_LENGTH not in headers
    outputs = json.loads(body)["outputs"]
    assert outputs == [
        {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16]},
        {"name": "OUTPUT1", "datatype": "INT32", "shape": [1, 16]},
    ]


def test_grpc_outputs_in_shared_memory_carry_no_parameters(
    server: ServerProcess, out_region: str
) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0")]
    outputs[0].set_shared_memory(out_region, BYTES)
    response = client.infer("simple", inputs, outputs=outputs).get_response()
    (output,) = response.outputs
    assert (output.name, output.datatype, list(output.shape)) == ("OUTPUT0", "INT32", [1, 16])
    assert len(output.parameters) == 0


@pytest.mark.parametrize(
    ("module", "binary"), [(httpclient, True), (httpclient, False), (grpcclient, True)]
)
def test_a_zero_element_output(server: ServerProcess, module: Any, binary: bool) -> None:
    url = server.http_url if module is httpclient else server.grpc_url
    client = module.InferenceServerClient(url)
    tensor = module.InferInput("INPUT0", [1, 0], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 0), dtype=np.float32))
    kwargs = {"binary_data": binary} if module is httpclient else {}
    outputs = [module.InferRequestedOutput("OUTPUT0", **kwargs)]
    result = client.infer("identity_fp32", [tensor], outputs=outputs)
    array = result.as_numpy("OUTPUT0")
    assert array.shape == (1, 0)
    assert array.dtype == np.float32


def test_a_zero_element_output_in_the_binary_response_says_size_zero(
    server: ServerProcess,
) -> None:
    doc = {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 0], "data": []}],
        "parameters": {"binary_data_output": True},
    }
    status, headers, body = _post(server, "identity_fp32", json.dumps(doc).encode(), {})
    assert status == 200, body
    length = int(headers[HEADER_LENGTH])
    assert length == len(body)
    (output,) = json.loads(body)["outputs"]
    assert output["parameters"] == {"binary_data_size": 0}
    assert output["shape"] == [1, 0]


def test_a_raw_binary_request(server: ServerProcess) -> None:
    """Inference-Header-Content-Length: 0, the body one tensor: batch 1, the variable dimension
    from the byte size, every output binary."""
    values = np.array([1.5, -2.0, 3.25], dtype=np.float32)
    status, headers, body = _post(
        server,
        "identity_fp32",
        values.tobytes(),
        {HEADER_LENGTH: "0", "Content-Type": "application/octet-stream"},
    )
    assert status == 200, body
    length = int(headers[HEADER_LENGTH])
    (output,) = json.loads(body[:length])["outputs"]
    assert output == {
        "name": "OUTPUT0",
        "datatype": "FP32",
        "shape": [1, 3],
        "parameters": {"binary_data_size": 12},
    }
    np.testing.assert_array_equal(np.frombuffer(body[length:], dtype=np.float32), values)


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (
            "simple",
            "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in "
            "'simple' model configuration",
        ),
        (
            "identity_bytes",
            "For BYTE datatype raw input 'INPUT0', the model must have input shape [1]",
        ),
    ],
)
def test_raw_binary_requests_tritonserver_refuses(
    server: ServerProcess, model: str, message: str
) -> None:
    status, _, body = _post(server, model, struct.pack("<4i", 1, 2, 3, 4), {HEADER_LENGTH: "0"})
    assert status == 400
    assert json.loads(body) == {"error": message}
