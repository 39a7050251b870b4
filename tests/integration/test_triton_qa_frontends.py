"""Frontend behaviours Triton's own qa suites check, as tritonserver answers them (found by
running those suites against this server): the health answers' empty body, reserved `triton_`
request parameters, a decoupled model over unary infer, and BYTES outputs that JSON cannot
carry."""

from __future__ import annotations

import http.client
import json
import queue
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.serverproc import ServerProcess

IDENTITY_BYTES = """\
name: "identity_str"
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_STRING, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_STRING, dims: [ -1 ] } ]
"""

HTTP_RESERVED = (
    "parameter keys starting with 'triton_' are reserved for Triton usage and should not be "
    "specified."
)
GRPC_RESERVED = (
    "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following "
    "keys starting with 'triton_' are allowed: triton_enable_empty_final_response"
)


@pytest.fixture(scope="module")
def unready(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server that is live but not ready (--strict-readiness, one model fails to load); its
    other model serves."""
    root = tmp_path_factory.mktemp("qa_frontends")
    models = root / "models"
    (models / "identity_str" / "1").mkdir(parents=True)
    (models / "identity_str" / "config.pbtxt").write_text(IDENTITY_BYTES)
    (models / "broken" / "1").mkdir(parents=True)
    (models / "broken" / "config.pbtxt").write_text("this is { not a config")
    proc = ServerProcess(models, "--strict-readiness=true", log_path=root / "server.log")
    try:
        proc.wait_ready(timeout_s=120, path="/v2/health/live")
        yield proc
    finally:
        proc.stop()


def _get(server: ServerProcess, path: str) -> tuple[int, bytes]:
    host, port = server.http_url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


# ---- health: an empty body, as tritonserver's ------------------------------------------------


def test_health_answers_have_an_empty_body(server: ServerProcess, unready: ServerProcess) -> None:
    assert _get(server, "/v2/health/ready") == (200, b"")
    assert _get(server, "/v2/health/live") == (200, b"")
    assert _get(unready, "/v2/health/ready") == (400, b"")
    assert _get(unready, "/v2/health/live") == (200, b"")
    # Triton's clients read only the status.
    assert httpclient.InferenceServerClient(server.http_url).is_server_ready()
    assert not httpclient.InferenceServerClient(unready.http_url).is_server_ready()


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_tritons_wait_for_server_ready_line_sees_exactly_the_status(
    server: ServerProcess, unready: ServerProcess
) -> None:
    """qa/common/util.sh's wait_for_server_ready compares this output to exactly `200`."""
    for proc, expected in ((server, "200"), (unready, "400")):
        url = f"{proc.http_url}/v2/health/ready"
        out = subprocess.run(
            ["curl", "-s", "-w", "%{http_code}", url], capture_output=True, text=True, timeout=10
        ).stdout
        assert out == expected


def test_verbose_readiness_says_why(unready: ServerProcess) -> None:
    status, body = _get(unready, "/v2/health/ready?verbose=true")
    assert status == 400
    doc = json.loads(body)
    assert doc["ready"] is False
    assert any("broken" in problem for problem in doc["problems"]), doc


# ---- request parameters starting `triton_` ----------------------------------------------------


def _str_input(module: Any, value: bytes = b"abc") -> Any:
    inp = module.InferInput("INPUT0", [1], "BYTES")
    inp.set_data_from_numpy(np.array([value], dtype=np.object_))
    return inp


def _post(server: ServerProcess, path: str, doc: dict[str, Any]) -> tuple[int, bytes]:
    """Raw HTTP: tritonclient itself refuses to send `triton_` parameters."""
    host, port = server.http_url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("POST", path, json.dumps(doc), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _grpc_infer(server: ServerProcess, params: dict[str, Any]) -> grpc.RpcError:
    """Raw gRPC ModelInfer: tritonclient itself refuses to send `triton_` parameters."""
    request = service_pb2.ModelInferRequest(model_name="identity_str")
    tensor = request.inputs.add(name="INPUT0", datatype="BYTES", shape=[1])
    tensor.contents.bytes_contents.append(b"abc")
    for key, value in params.items():
        if isinstance(value, bool):
            request.parameters[key].bool_param = value
        else:
            request.parameters[key].string_param = value
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(request, timeout=10)
    return err.value


INFER_DOC = {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1], "data": ["abc"]}]}


@pytest.mark.parametrize("key", ["triton_enable_empty_final_response", "triton_x", "triton_"])
def test_http_refuses_every_triton_parameter(unready: ServerProcess, key: str) -> None:
    doc = {**INFER_DOC, "parameters": {key: "dummy-value"}}
    status, body = _post(unready, "/v2/models/identity_str/infer", doc)
    assert (status, json.loads(body)) == (400, {"error": HTTP_RESERVED})
    # Without it the same request serves.
    assert _post(unready, "/v2/models/identity_str/infer", INFER_DOC)[0] == 200


def test_grpc_refuses_triton_parameters_but_the_empty_final_response_flag(
    unready: ServerProcess,
) -> None:
    err = _grpc_infer(unready, {"triton_x": "dummy-value"})
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == GRPC_RESERVED
    # tritonclient sends triton_enable_empty_final_response itself on streams: it works, and
    # it is the frontend's setting, not a parameter the model sees.
    client = grpcclient.InferenceServerClient(unready.grpc_url)
    results: queue.Queue = queue.Queue()  # type: ignore[type-arg]
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer(
            "identity_str", [_str_input(grpcclient)], enable_empty_final_response=True
        )
        result, error = results.get(timeout=30)
    finally:
        client.stop_stream()
    assert error is None, error
    assert result.as_numpy("OUTPUT0").tolist() == [b"abc"]
    assert result.get_response().parameters["triton_final_response"].bool_param


def test_grpc_empty_final_response_flag_must_be_a_bool(unready: ServerProcess) -> None:
    err = _grpc_infer(unready, {"triton_enable_empty_final_response": "yes"})
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == (
        "invalid value type for 'triton_enable_empty_final_response' parameter, expected "
        "bool_param."
    )


# ---- a decoupled model over unary infer -------------------------------------------------------


def _repeat_input(module: Any) -> Any:
    inp = module.InferInput("IN", [1], "INT32")
    inp.set_data_from_numpy(np.array([1], dtype=np.int32))
    return inp


def test_decoupled_model_over_grpc_model_infer_has_tritons_words(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as err:
        client.infer("py_repeat", [_repeat_input(grpcclient)])
    assert err.value.status() == "StatusCode.UNIMPLEMENTED"
    message = str(err.value)
    assert "ModelInfer RPC doesn't support models with decoupled transaction policy" in message
    assert "ModelStreamInfer" in message  # our explanation follows


def test_decoupled_model_over_http_infer_has_tritons_words(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException) as err:
        client.infer("py_repeat", [_repeat_input(httpclient)])
    assert err.value.status() == "501"  # tritonserver: UNSUPPORTED is 501 Not Implemented
    message = str(err.value)
    assert "HTTP end point doesn't support models with decoupled transaction policy" in message
    assert "ModelStreamInfer" in message


# ---- BYTES outputs JSON cannot carry ----------------------------------------------------------


def test_non_utf8_bytes_output_as_json_is_refused(unready: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(unready.http_url)
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)
    with pytest.raises(InferenceServerException) as err:
        client.infer("identity_str", [_str_input(httpclient, b"\xff")], outputs=[out])
    assert err.value.status() == "400"
    assert "not valid UTF-8" in str(err.value)
    assert "OUTPUT0" in str(err.value)
    # The same bytes as binary data come back as they are; UTF-8 text still comes as JSON.
    binary = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
    result = client.infer("identity_str", [_str_input(httpclient, b"\xff")], outputs=[binary])
    assert result.as_numpy("OUTPUT0").tolist() == [b"\xff"]
    text = client.infer("identity_str", [_str_input(httpclient, "é".encode())], outputs=[out])
    assert text.get_response()["outputs"][0]["data"] == ["é"]


# ---- log settings: the log file is not a network client's to choose -------------------------


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=("http", "grpc"))
def test_log_file_over_the_network_is_refused_in_tritons_words(
    server: ServerProcess, module: Any
) -> None:
    """L0_logging's logging_endpoint_test matches tritonserver's words (501 / UNIMPLEMENTED)."""
    client = server.client(module)
    try:
        with pytest.raises(InferenceServerException) as info:
            client.update_log_settings({"log_file": "log_file.log", "log_info": True})
        assert str(info.value.status()) in ("501", "StatusCode.UNIMPLEMENTED")
        assert "log file location can not be updated through network protocol" in str(info.value)
        assert client.get_log_settings(**({"as_json": True} if module is grpcclient else {}))
    finally:
        client.close()


# ---- restricted APIs: tritonserver's words per protocol -------------------------------------


def test_restricted_apis_are_refused_in_tritons_words(tmp_path: Any) -> None:
    """L0_grpc's RestrictedProtocolTest matches gRPC's "This protocol is restricted" (HTTP's
    words name the API)."""
    models = tmp_path / "models"
    (models / "identity_str" / "1").mkdir(parents=True)
    (models / "identity_str" / "config.pbtxt").write_text(IDENTITY_BYTES)
    flags = ("--grpc-restricted-protocol=health:infer-key=v1", "--http-restricted-api=metadata:k=v")
    with ServerProcess(models, *flags, log_path=tmp_path / "server.log") as proc:
        grpc_client = proc.client(grpcclient)
        http_client = proc.client(httpclient)
        try:
            with pytest.raises(InferenceServerException) as info:
                grpc_client.is_server_live()
            assert (
                "This protocol is restricted, expecting header 'triton-grpc-protocol-infer-key'"
            ) in str(info.value)
            assert grpc_client.is_server_live(headers={"triton-grpc-protocol-infer-key": "v1"})
            with pytest.raises(InferenceServerException) as info:
                http_client.get_server_metadata()
            assert "This API is restricted, expecting header 'k'" in str(info.value)
            assert http_client.get_server_metadata(headers={"k": "v"})["name"]
        finally:
            grpc_client.close()
            http_client.close()


def test_a_nameless_cuda_region_is_refused_in_tritons_words(server: ServerProcess) -> None:
    """L0_grpc's aio test registers a CUDA region with no name, handle or size."""
    client = server.client(grpcclient)
    try:
        with pytest.raises(InferenceServerException) as info:
            client.register_cuda_shared_memory("", b"", 0, 0)
        assert str(info.value.status()) == "StatusCode.INVALID_ARGUMENT"
        assert "failed to register shared memory region: invalid args" in str(info.value)
    finally:
        client.close()
