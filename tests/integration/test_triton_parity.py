"""tritonserver's answers that the differential suite (tests/differential/) measured, held here
without the reference: each assertion is what tritonserver 2.51 answers to the same request
(and its current source agrees), on the differential suite's own Python models."""

from __future__ import annotations

import json
import socket
import struct
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.differential import cases, repo
from tests.differential.harness import Http, b64, send_http
from tests.serverproc import ServerProcess

_F4 = [1.0, 2.0, 3.0, 4.0]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("parity")
    repository = repo.build(root / "models", ("add_sub", "identity_int32", "repeat", "pipeline"))
    proc = ServerProcess(
        repository,
        "--model-control-mode=explicit",
        "--load-model=*",
        "--allow-client-shm=true",
        log_path=root / "server.log",
    )
    with proc:
        yield proc


def _http(server: ServerProcess, method: str, path: str, body: Any = None) -> Any:
    return send_http(server.http_url, Http(method, path, body))


def _add_sub(**extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": _F4},
            {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": _F4},
        ]
    }
    body.update(extra)
    return body


def _stub(server: ServerProcess) -> Any:
    return service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(server.grpc_url))


def _grpc_add_sub(**extra: Any) -> Any:
    data = b64(struct.pack("<4f", *_F4))
    body = {
        "model_name": "add_sub",
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4]},
            {"name": "INPUT1", "datatype": "FP32", "shape": [1, 4]},
        ],
        "raw_input_contents": [data, data],
        **extra,
    }
    return json_format.ParseDict(body, service_pb2.ModelInferRequest())


def test_routes_methods_and_empty_answers(served: ServerProcess) -> None:
    """405 for a known path's other method, 404 "Not Found" for any other path (a version of
    anything but ASCII digits included: u0661 was read as version 1), text/plain on the health
    routes' empty answers, application/json on the control routes' empty answers."""
    assert _http(served, "POST", "/v2/health/live") == {
        "status": 405,
        "body": {"error": "Method Not Allowed"},
    }
    assert _http(served, "GET", "/v2/models/add_sub/infer")["status"] == 405
    for path in ("/v2/nonsense", "/v2/models/add_sub/versions/abc", "/v3/models/add_sub"):
        assert _http(served, "GET", path) == {"status": 404, "body": {"error": "Not Found"}}
    arabic_one = "/v2/models/add_sub/versions/%D9%A1/infer"
    assert _http(served, "POST", arabic_one, _add_sub()) == {
        "status": 404,
        "body": {"error": "Not Found"},
    }
    assert _http(served, "GET", "/v2/health/ready") == {
        "status": 200,
        "type": "text/plain",
        "body": "",
    }
    assert _http(served, "GET", "/v2/models/add_sub/versions/7/ready") == {
        "status": 400,
        "body": {"error": "Model version not ready"},
    }
    assert _http(served, "POST", "/v2/systemsharedmemory/unregister") == {
        "status": 200,
        "type": "application/json",
        "body": "",
    }


def test_unknown_models_versions_and_their_statistics(served: ServerProcess) -> None:
    assert _http(served, "GET", "/v2/models/nope") == {
        "status": 404,
        "body": {"error": "Request for unknown model: 'nope' is not found"},
    }
    assert _http(served, "GET", "/v2/models/nope/stats") == {
        "status": 400,
        "body": {"error": "requested model 'nope' is not available"},
    }
    assert _http(served, "GET", "/v2/models/add_sub/versions/7/stats") == {
        "status": 400,
        "body": {"error": "requested model version is not available for model 'add_sub'"},
    }
    assert _http(served, "GET", "/v2/models/nope/trace/setting") == {
        "status": 400,
        "body": {"error": "Request for unknown model : nope"},
    }


def test_validation_errors_carry_the_request_id(served: ServerProcess) -> None:
    body = _add_sub(id="r1")
    body["inputs"][0]["datatype"] = "INT32"
    body["inputs"][0]["data"] = [1, 2, 3, 4]
    expected = "inference input 'INPUT0' data-type is 'INT32', but model 'add_sub' expects 'FP32'"
    assert _http(served, "POST", "/v2/models/add_sub/infer", body)["body"] == {
        "error": f"[request id: r1] {expected}"
    }
    del body["id"]
    assert _http(served, "POST", "/v2/models/add_sub/infer", body)["body"] == {
        "error": f"[request id: <id_unknown>] {expected}"
    }
    shape = _grpc_add_sub()
    del shape.inputs[0].shape[:]
    shape.inputs[0].shape.extend([1, 2, 2])
    with pytest.raises(grpc.RpcError) as info:
        _stub(served).ModelInfer(shape)
    assert info.value.details().startswith(
        "[request id: <id_unknown>] unexpected shape for input 'INPUT0' for model 'add_sub'. "
        "Expected [-1,4], got [1,2,2]. NOTE: Setting a non-zero max_batch_size"
    )


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        (
            {"sequence_start": "yes"},
            "Unable to parse 'sequence_start': attempt to access JSON non-boolean as boolean",
        ),
        (
            {"sequence_id": -1},
            "Unable to parse 'sequence_id': attempt to access JSON non-string as string",
        ),
        (
            {"binary_data_output": "yes"},
            "Unable to parse 'binary_data_output': attempt to access JSON non-boolean as boolean",
        ),
        (
            {"custom": None},
            "parameter 'custom' has invalid type. It should be either 'int', 'bool', or 'string'.",
        ),
        (
            {"custom": {"a": 1}},
            "parameter 'custom' has invalid type. It should be either 'int', 'bool', or 'string'.",
        ),
    ],
)
def test_parameters_tritonserver_refuses(
    served: ServerProcess, parameters: dict[str, Any], message: str
) -> None:
    """Refused in tritonserver's words (it answers 500 for the reserved ones: here 400); before,
    they were read loosely ("yes" as true, -1 as a sequence id)."""
    answer = _http(served, "POST", "/v2/models/add_sub/infer", _add_sub(parameters=parameters))
    assert answer == {"status": 400, "body": {"error": message}}


def test_an_object_id_and_a_grpc_int64_sequence_start_are_refused(served: ServerProcess) -> None:
    answer = _http(served, "POST", "/v2/models/add_sub/infer", _add_sub(id={"a": 1}))
    assert answer == {
        "status": 400,
        "body": {"error": "Unable to parse 'id': attempt to access JSON non-string as string"},
    }
    request = _grpc_add_sub()
    request.parameters["sequence_start"].int64_param = 1
    with pytest.raises(grpc.RpcError) as info:
        _stub(served).ModelInfer(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == (
        "invalid value type for 'sequence_start' parameter, expected bool_param."
    )


def test_an_empty_outputs_list_means_every_output(served: ServerProcess) -> None:
    answer = _http(served, "POST", "/v2/models/add_sub/infer", _add_sub(outputs=[]))
    assert [output["name"] for output in answer["body"]["outputs"]] == ["OUTPUT0", "OUTPUT1"]


def test_a_models_error_response_reaches_the_client_as_it_is(served: ServerProcess) -> None:
    body = _add_sub()
    body["inputs"][0]["data"] = [-999.0, 0.0, 0.0, 0.0]
    assert _http(served, "POST", "/v2/models/add_sub/infer", body) == {
        "status": 500,
        "body": {"error": "add_sub refuses -999"},
    }


def test_an_ensembles_response_carries_its_sequence_parameters(served: ServerProcess) -> None:
    body = {
        "inputs": [
            {"name": "A", "shape": [1, 4], "datatype": "FP32", "data": _F4},
            {"name": "B", "shape": [1, 4], "datatype": "FP32", "data": _F4},
        ]
    }
    answer = _http(served, "POST", "/v2/models/pipeline/infer", body)
    assert answer["body"]["parameters"] == {
        "sequence_id": 0,
        "sequence_start": False,
        "sequence_end": False,
    }
    request = _grpc_add_sub(model_name="pipeline")
    request.inputs[0].name, request.inputs[1].name = "A", "B"
    params = _stub(served).ModelInfer(request).parameters
    assert params["sequence_id"].int64_param == 0
    assert params["sequence_start"].HasField("bool_param")
    assert not params["sequence_end"].bool_param


def test_stream_responses_carry_the_final_flag_and_errors_alone(served: ServerProcess) -> None:
    """triton_final_response on every response (without triton_enable_empty_final_response):
    true on a non-decoupled model's one response, false on a decoupled model's; a refused
    request's response carries the error and an empty response."""
    repeat = json_format.ParseDict(
        {
            "model_name": "repeat",
            "inputs": [{"name": "IN", "datatype": "INT32", "shape": [2]}],
            "raw_input_contents": [b64(struct.pack("<2i", 4, 5))],
        },
        service_pb2.ModelInferRequest(),
    )
    unknown = _grpc_add_sub(model_name="nope")
    answers = list(_stub(served).ModelStreamInfer(iter([_grpc_add_sub(), repeat, unknown])))
    by_model: dict[str, list[Any]] = {}
    for answer in answers:
        by_model.setdefault(answer.infer_response.model_name, []).append(answer)
    [add_sub] = by_model["add_sub"]
    assert add_sub.infer_response.parameters["triton_final_response"].bool_param is True
    assert [
        a.infer_response.parameters["triton_final_response"].HasField("bool_param")
        and not a.infer_response.parameters["triton_final_response"].bool_param
        for a in by_model["repeat"]
    ] == [True, True]
    [failed] = by_model[""]
    assert failed.error_message == "Request for unknown model: 'nope' is not found"
    assert failed.infer_response == service_pb2.ModelInferResponse()


def test_index_entries_and_a_model_with_no_ready_version(served: ServerProcess) -> None:
    index = _http(served, "POST", "/v2/repository/index", {})["body"]
    assert {"name": "add_sub", "version": "1", "state": "READY"} in index  # no "reason"
    refused = {"status": 400, "body": {"error": "Invalid value for 'ready': expected a boolean"}}
    assert _http(served, "POST", "/v2/repository/index", {"ready": "x"}) == refused
    depth = 250000  # L0_http's deeply nested 'ready': its type is refused before its depth
    nested = b'{"ready":' + b"[" * depth + b"true" + b"]" * depth + b"}"
    assert _http(served, "POST", "/v2/repository/index", nested) == refused
    unload = _http(served, "POST", "/v2/repository/models/identity_int32/unload")
    assert unload["status"] == 200
    try:
        assert _http(served, "GET", "/v2/models/identity_int32") == {
            "status": 404,
            "body": {
                "error": "Request for unknown model: 'identity_int32' has no available versions"
            },
        }
        assert _http(served, "GET", "/v2/models/identity_int32/stats") == {
            "status": 400,
            "body": {"error": "requested model 'identity_int32' is not available"},
        }
        overrides = {"parameters": {"file:1/model.py": b64(b"x")}}
        answer = _http(served, "POST", "/v2/repository/models/identity_int32/load", overrides)
        assert answer["body"]["error"].startswith(
            "failed to load 'identity_int32', failed to poll from model repository: "
        )
    finally:
        assert _http(served, "POST", "/v2/repository/models/identity_int32/load")["status"] == 200


def test_shared_memory_registration_without_a_key(served: ServerProcess) -> None:
    answer = _http(
        served, "POST", "/v2/systemsharedmemory/region/r/register", {"offset": 0, "byte_size": 4}
    )
    assert answer == {
        "status": 400,
        "body": {"error": "Shared memory register request has no 'key' field"},
    }


def test_load_and_unload_outside_explicit_mode_are_unavailable(tmp_path: Path) -> None:
    repository = repo.build(tmp_path / "models", ("identity_int32",))
    with ServerProcess(repository, log_path=tmp_path / "server.log") as proc:
        for action in ("load", "unload"):
            answer = _http(proc, "POST", f"/v2/repository/models/identity_int32/{action}")
            assert answer == {
                "status": 503,
                "body": {
                    "error": "explicit model load / unload is not allowed if polling is enabled"
                },
            }
        with pytest.raises(grpc.RpcError) as info:
            _stub(proc).RepositoryModelLoad(
                service_pb2.RepositoryModelLoadRequest(model_name="identity_int32")
            )
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def _expecting(server: ServerProcess, path: str, length: int) -> tuple[socket.socket, bytes]:
    """A request head with Expect: 100-continue and no body yet; what the server answers."""
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\nExpect: 100-continue\r\n\r\n"
    )
    sock.sendall(head.encode())
    return sock, sock.recv(65536)


def _rest(sock: socket.socket, first: bytes) -> bytes:
    """`first` and what follows until the connection closes."""
    answer = first
    while data := sock.recv(65536):
        answer += data
    return answer


def test_expect_100_continue_is_answered(served: ServerProcess) -> None:
    """Expect: 100-continue is answered before the body, on the infer route (the fast path)
    as on any other: 100 Continue and then the answer; a body over the limit refused with
    413 at once, before it is sent (the infer route gave no answer at all)."""
    body = json.dumps(_add_sub()).encode()
    for path in ("/v2/models/add_sub/infer", "/v2/repository/index"):
        sock, first = _expecting(served, path, len(body))
        with sock:
            assert first.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), (path, first)
            sock.sendall(body)
            answer = first[len(b"HTTP/1.1 100 Continue\r\n\r\n") :] or sock.recv(65536)
            assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), (path, answer)
    sock, first = _expecting(served, "/v2/models/add_sub/infer", 1 << 40)
    with sock:
        answer = _rest(sock, first)
    assert answer.startswith(b"HTTP/1.1 413 Request Entity Too Large\r\n"), answer
    assert b"request JSON size exceeds the maximum allowed input size" in answer
    assert b"Connection: close" in answer


_PINNED = {
    "priority": "PRIORITY_DEFAULT",
    "input_pinned_memory": {"enable": True},
    "output_pinned_memory": {"enable": True},
    "gather_kernel_buffer_threshold": 0,
    "eager_batching": False,
}


def test_the_served_config_has_tritons_normalised_defaults(served: ServerProcess) -> None:
    """Triton's core normalises every config (NormalizeModelConfig, NormalizeInstanceGroup):
    pinned-memory options, `preferred_batch_size: [max_batch_size]`, the sequence batcher's
    idle time, a default instance group named as the model; none of it on an ensemble. HTTP
    writes every field in the .proto's order, gRPC the fields that are set."""
    config = _http(served, "GET", "/v2/models/add_sub/config")["body"]
    assert list(config) == [
        "name", "platform", "backend", "runtime", "version_policy", "max_batch_size", "input",
        "output", "batch_input", "batch_output", "optimization", "dynamic_batching",
        "instance_group", "default_model_filename", "cc_model_filenames", "metric_tags",
        "parameters", "model_warmup",
    ]  # fmt: skip
    assert config["optimization"] == _PINNED
    assert config["dynamic_batching"]["preferred_batch_size"] == [8]
    grpc_config = _stub(served).ModelConfig(service_pb2.ModelConfigRequest(name="add_sub")).config
    assert list(grpc_config.dynamic_batching.preferred_batch_size) == [8]
    assert grpc_config.optimization.input_pinned_memory.enable
    ensemble = _http(served, "GET", "/v2/models/pipeline/config")["body"]
    assert ensemble["instance_group"] == []
    assert "optimization" not in ensemble
    # A config without instance groups or the sequence batcher's settings (loaded as an
    # override of identity_int32's, then put back).
    override = {
        "backend": "python",
        "max_batch_size": 2,
        "input": [{"name": "IN", "data_type": "TYPE_INT32", "dims": [-1]}],
        "output": [{"name": "OUT", "data_type": "TYPE_INT32", "dims": [-1]}],
        "sequence_batching": {"oldest": {}},
    }
    path = "/v2/repository/models/identity_int32/load"
    body = {"parameters": {"config": json.dumps(override)}}
    try:
        assert _http(served, "POST", path, body)["status"] == 200
        config = _http(served, "GET", "/v2/models/identity_int32/config")["body"]
        assert config["sequence_batching"]["max_sequence_idle_microseconds"] == 1000000
        assert config["sequence_batching"]["oldest"]["preferred_batch_size"] == [2]
        assert [(g["name"], g["kind"], g["count"]) for g in config["instance_group"]] == [
            ("identity_int32", "KIND_CPU", 1)
        ]
        assert config["optimization"] == _PINNED
    finally:
        assert _http(served, "POST", path)["status"] == 200


def test_a_repository_given_twice_is_one_repository(tmp_path: Path) -> None:
    """tritonserver keeps its repositories in a set: the same path twice serves its models
    once (here also another spelling of the same folder); it refused to start, 'model is in
    two repositories'."""
    repository = repo.build(tmp_path / "models", ("identity_int32",))
    given: list[Path | str] = [repository, repository, f"{repository}/"]
    with ServerProcess(given, log_path=tmp_path / "server.log") as proc:
        index = _http(proc, "POST", "/v2/repository/index", {})["body"]
        assert index == [{"name": "identity_int32", "version": "1", "state": "READY"}]


def test_a_version_policy_that_matches_no_folder(served: ServerProcess) -> None:
    """tritonserver's words (core's ModelLifeCycle::AsyncLoad) after its load prefix, with its
    closing newline; the version loaded before keeps serving."""
    override = {
        "backend": "python",
        "input": [{"name": "IN", "data_type": "TYPE_INT32", "dims": [-1]}],
        "output": [{"name": "OUT", "data_type": "TYPE_INT32", "dims": [-1]}],
        "version_policy": {"specific": {"versions": [5]}},  # the folder holds version 1
    }
    words = (
        "load failed for model 'identity_int32': at least one version must be available "
        "under the version policy of model 'identity_int32'\n"
    )
    path = "/v2/repository/models/identity_int32/load"
    body = {"parameters": {"config": json.dumps(override)}}
    assert _http(served, "POST", path, body) == {"status": 400, "body": {"error": words}}
    with pytest.raises(grpc.RpcError) as info:
        _stub(served).RepositoryModelLoad(
            service_pb2.RepositoryModelLoadRequest(
                model_name="identity_int32",
                parameters={"config": service_pb2.ModelRepositoryParameter(
                    string_param=json.dumps(override)
                )},
            )
        )  # fmt: skip
    assert (info.value.code(), info.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, words)
    assert _http(served, "GET", "/v2/models/identity_int32/ready")["status"] == 200
    assert "matches none of the version folders (found [1] in " in served.log()
# ---- statistics and metrics counted as tritonserver counts them ------------------------------


@pytest.fixture(scope="module")
def counting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server of its own, so that each model's counts below are of the test's traffic."""
    root = tmp_path_factory.mktemp("counting")
    repository = repo.build(
        root / "models", ("add_sub", "identity_bytes", "accumulate", "raises", "pipeline")
    )
    proc = ServerProcess(
        repository, "--model-control-mode=explicit", "--load-model=*", log_path=root / "server.log"
    )
    with proc:
        yield proc


def _counts(server: ServerProcess, model: str) -> dict[str, Any]:
    """A model's statistics (normalised: a duration is "N" or 0), durations as non-zero."""
    answer = _http(server, "GET", f"/v2/models/{model}/stats")
    (stats,) = answer["body"]["model_stats"]
    inference = stats["inference_stats"]
    return {
        "inference_count": stats["inference_count"],
        "execution_count": stats["execution_count"],
        "last_inference": stats["last_inference"] != 0,
        **{
            name: (inference[name]["count"], inference[name]["ns"] != 0)
            for name in ("success", "fail", "queue", "compute_input", "compute_infer")
        },
        "batch_stats": [
            (b["batch_size"], b["compute_infer"]["count"], b["compute_infer"]["ns"] != 0)
            for b in stats["batch_stats"]
        ],
    }


def _metrics(server: ServerProcess) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics") as answer:
        return str(answer.read().decode())


def _series(server: ServerProcess, family: str, model: str, reason: str = "") -> float:
    labels = f'model="{model}",' + (f'reason="{reason}",' if reason else "") + 'version="1"'
    prefix = f"{family}{{{labels}}} "
    for line in _metrics(server).splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    raise AssertionError(f"no series {prefix}")


def _grpc_infer(server: ServerProcess, body: dict[str, Any]) -> grpc.StatusCode:
    request = json_format.ParseDict(body, service_pb2.ModelInferRequest())
    try:
        _stub(server).ModelInfer(request, timeout=30)
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def test_a_models_error_response_counts_as_a_success(counting: ServerProcess) -> None:
    """tritonserver's Python backend reports a request whose response is an error
    (pb_utils.InferenceResponse(error=...)) as a success: the client gets the error, the
    statistics and nv_inference_* count an inference. An ensemble whose step answered so
    failed (OTHER, counted twice as tritonserver counts it), its step's model succeeded."""
    body = _add_sub()
    body["inputs"][0]["data"] = [-999.0, 0.0, 0.0, 0.0]
    assert _http(counting, "POST", "/v2/models/add_sub/infer", body)["status"] == 500
    refused = _grpc_add_sub()
    refused.raw_input_contents[0] = struct.pack("<4f", -999.0, 0, 0, 0)
    with pytest.raises(grpc.RpcError) as failed:
        _stub(counting).ModelInfer(refused, timeout=30)
    assert failed.value.code() == grpc.StatusCode.INTERNAL
    assert _counts(counting, "add_sub") == {
        "inference_count": 2,
        "execution_count": 2,
        "last_inference": True,
        "success": (2, True),
        "fail": (0, False),
        "queue": (2, True),
        "compute_input": (2, True),
        "compute_infer": (2, True),
        "batch_stats": [(1, 2, True)],
    }
    assert _series(counting, "nv_inference_request_success", "add_sub") == 2
    assert _series(counting, "nv_inference_request_failure", "add_sub", "BACKEND") == 0
    assert _series(counting, "nv_inference_count", "add_sub") == 2
    # An ensemble: its queue time and its steps' compute durations, as tritonserver counts.
    pipeline = {
        "inputs": [
            {"name": "A", "shape": [1, 4], "datatype": "FP32", "data": _F4},
            {"name": "B", "shape": [1, 4], "datatype": "FP32", "data": _F4},
        ]
    }
    assert _http(counting, "POST", "/v2/models/pipeline/infer", pipeline)["status"] == 200
    pipeline["inputs"][0]["data"] = [-999.0, 0.0, 0.0, 0.0]
    assert _http(counting, "POST", "/v2/models/pipeline/infer", pipeline) == {
        "status": 500,
        "body": {"error": "in ensemble 'pipeline', add_sub refuses -999"},
    }
    assert _counts(counting, "pipeline") == {
        "inference_count": 1,
        "execution_count": 1,
        "last_inference": True,
        "success": (1, True),
        "fail": (2, True),
        "queue": (1, True),
        "compute_input": (1, True),
        "compute_infer": (1, True),
        "batch_stats": [(1, 1, True)],
    }
    assert _series(counting, "nv_inference_request_failure", "pipeline", "OTHER") == 2
    assert _counts(counting, "add_sub")["success"] == (4, True)  # its step succeeded twice


def test_an_execute_that_raised_counts_as_an_execution(counting: ServerProcess) -> None:
    """execute() raised: an execution with its batch statistics (tritonserver's Python
    backend reports them whatever execute() did), each request a BACKEND failure with no
    queue or compute time and no inference."""
    one = {"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [1]}]}
    assert _http(counting, "POST", "/v2/models/raises/infer", one)["status"] == 500
    grpc_one = {
        "model_name": "raises",
        "inputs": [{"name": "IN", "datatype": "INT32", "shape": [1]}],
        "raw_input_contents": [b64(struct.pack("<i", 1))],
    }
    assert _grpc_infer(counting, grpc_one) == grpc.StatusCode.INTERNAL
    assert _counts(counting, "raises") == {
        "inference_count": 0,
        "execution_count": 2,
        "last_inference": True,
        "success": (0, False),
        "fail": (2, True),
        "queue": (0, False),
        "compute_input": (0, False),
        "compute_infer": (0, False),
        "batch_stats": [(1, 2, True)],
    }
    assert _series(counting, "nv_inference_exec_count", "raises") == 2
    assert _series(counting, "nv_inference_request_failure", "raises", "BACKEND") == 2
    assert _series(counting, "nv_inference_count", "raises") == 0


def test_sequence_refusals_are_not_counted(counting: ServerProcess) -> None:
    """A sequence request without START, or after its sequence ended: tritonserver's sequence
    batcher refuses it before its queue (Enqueue's error), counted nowhere."""

    def step(sequence: int, **flags: bool) -> dict[str, Any]:
        return {
            "inputs": [{"name": "IN", "shape": [1, 1], "datatype": "INT32", "data": [1]}],
            "parameters": {"sequence_id": sequence, **flags},
        }

    no_start = _http(counting, "POST", "/v2/models/accumulate/infer", step(5))
    assert no_start["status"] == 400
    assert "must specify the START flag" in no_start["body"]["error"]
    whole = step(6, sequence_start=True, sequence_end=True)
    assert _http(counting, "POST", "/v2/models/accumulate/infer", whole)["status"] == 200
    assert _http(counting, "POST", "/v2/models/accumulate/infer", step(6))["status"] == 400
    grpc_no_start = {
        "model_name": "accumulate",
        "inputs": [{"name": "IN", "datatype": "INT32", "shape": [1, 1]}],
        "raw_input_contents": [b64(struct.pack("<i", 1))],
        "parameters": {"sequence_id": {"int64_param": 7}},
    }
    assert _grpc_infer(counting, grpc_no_start) == grpc.StatusCode.INVALID_ARGUMENT
    counts = _counts(counting, "accumulate")
    assert counts["success"] == counts["queue"] == (1, True)  # the sequence that started
    assert counts["fail"] == (0, False)
    assert _series(counting, "nv_inference_request_failure", "accumulate", "OTHER") == 0


def test_bytes_data_past_its_end_is_a_backend_failure(counting: ServerProcess) -> None:
    """A BYTES element whose length runs past the data: refused in tritonserver's words, and
    counted as its backend's failure (the Python backend finds it reading the request)."""
    prefixed = struct.pack("<I", 2) + b"ab" + struct.pack("<I", 50) + b"c"
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "IN",
                    "shape": [2],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(prefixed)},
                }
            ]
        }
    ).encode()
    request = Http(
        "POST",
        "/v2/models/identity_bytes/infer",
        header + prefixed,
        (("Inference-Header-Content-Length", str(len(header))),),
    )
    assert send_http(counting.http_url, request) == {
        "status": 400,
        "body": {
            "error": "incomplete string data for inference input 'IN', expecting string of "
            "length 50 but only 1 bytes available"
        },
    }
    grpc_request = {
        "model_name": "identity_bytes",
        "inputs": [{"name": "IN", "datatype": "BYTES", "shape": [2]}],
        "raw_input_contents": [b64(prefixed)],
    }
    assert _grpc_infer(counting, grpc_request) == grpc.StatusCode.INVALID_ARGUMENT
    counts = _counts(counting, "identity_bytes")
    assert (counts["success"], counts["fail"]) == ((0, False), (2, True))
    assert counts["execution_count"] == 0
    assert _series(counting, "nv_inference_request_failure", "identity_bytes", "BACKEND") == 2


def test_every_models_statistics_by_name_and_the_pinned_memory_gauges(
    counting: ServerProcess,
) -> None:
    """GET /v2/models/stats lists the models by name (the ensemble among them), as
    tritonserver's ordered map does; /metrics has the pinned memory pool gauges in
    tritonserver's words, 0 as a CPU-only tritonserver reports them (there is no pool)."""
    listed = _http(counting, "GET", "/v2/models/stats")["body"]["model_stats"]
    assert [entry["name"] for entry in listed] == [
        "accumulate",
        "add_sub",
        "identity_bytes",
        "pipeline",
        "raises",
    ]
    text = _metrics(counting)
    for name, what in (("total", "total memory size"), ("used", "used memory size")):
        family = f"nv_pinned_memory_pool_{name}_bytes"
        assert f"# HELP {family} Pinned memory pool {what}, in bytes\n" in text
        assert f"# TYPE {family} gauge\n{family} 0" in text


def test_unloading_an_unknown_model_succeeds(counting: ServerProcess) -> None:
    """tritonserver's unload of a model it does not know is a success (nothing to unload)."""
    assert _http(counting, "POST", "/v2/repository/models/no_such_model/unload") == {
        "status": 200,
        "type": "application/json",
        "body": "",
    }
    unload = service_pb2.RepositoryModelUnloadRequest(model_name="no_such_model")
    assert _stub(counting).RepositoryModelUnload(unload, timeout=30) is not None


def test_nv_counters_go_on_across_a_reload(tmp_path: Path) -> None:
    """A reload of a loaded version (an explicit load again): tritonserver's metric reporter
    of the version is shared by the version that replaces it, so the nv_* counters go on
    while the statistics extension's counts start again (2.51, measured side by side); after
    an unload a later load starts the counters from 0."""
    repository = repo.build(tmp_path / "models", ("identity_int32",))
    with ServerProcess(
        repository, "--model-control-mode=explicit", "--load-model=*", log_path=tmp_path / "log"
    ) as server:
        one = {"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [1]}]}
        for _ in range(3):
            assert _http(server, "POST", "/v2/models/identity_int32/infer", one)["status"] == 200
        load = "/v2/repository/models/identity_int32/load"
        assert _http(server, "POST", load, {})["status"] == 200
        assert _counts(server, "identity_int32")["success"] == (0, False)
        assert _http(server, "POST", "/v2/models/identity_int32/infer", one)["status"] == 200
        assert _counts(server, "identity_int32")["success"] == (1, True)
        assert _series(server, "nv_inference_request_success", "identity_int32") == 4
        assert _series(server, "nv_inference_exec_count", "identity_int32") == 4
        assert _series(server, "nv_inference_compute_infer_duration_us", "identity_int32") > 0
        assert _http(server, "POST", load, {})["status"] == 200  # again: carried twice
        assert _series(server, "nv_inference_count", "identity_int32") == 4
        unload = "/v2/repository/models/identity_int32/unload"
        assert _http(server, "POST", unload, {})["status"] == 200
        assert _http(server, "POST", load, {})["status"] == 200
        assert _series(server, "nv_inference_request_success", "identity_int32") == 0


def test_a_model_loaded_only_from_overrides_is_not_in_the_index(served: ServerProcess) -> None:
    """tritonserver's index lists the repository's model folders: a model a load request made
    from file overrides alone serves, but is listed neither while loaded nor after."""
    config = {
        "name": "from_overrides",
        "backend": "python",
        "max_batch_size": 0,
        "input": [{"name": "IN", "data_type": "TYPE_INT32", "dims": [-1]}],
        "output": [{"name": "OUT", "data_type": "TYPE_INT32", "dims": [-1]}],
    }
    files = {"file:1/model.py": b64(repo.source("identity_int32").encode())}
    body = {"parameters": {"config": json.dumps(config), **files}}
    path = "/v2/repository/models/from_overrides"
    assert _http(served, "POST", f"{path}/load", body)["status"] == 200
    try:
        assert _http(served, "GET", "/v2/models/from_overrides/ready")["status"] == 200
        names = [row["name"] for row in _http(served, "POST", "/v2/repository/index", {})["body"]]
        assert "from_overrides" not in names
        assert "add_sub" in names
    finally:
        assert _http(served, "POST", f"{path}/unload")["status"] == 200
    names = [row["name"] for row in _http(served, "POST", "/v2/repository/index", {})["body"]]
    assert "from_overrides" not in names


# tritonserver looks the model up (unknown model, unknown version, no ready version) before it
# reads a request's inputs: the model's error is the answer, whatever is wrong with the inputs.
_REFUSED = [
    ("nope", "", "Request for unknown model: 'nope' is not found"),
    ("add_sub", "7", "Request for unknown model: 'add_sub' version 7 is not found"),
]


@pytest.mark.parametrize(("model", "version", "message"), _REFUSED)
def test_the_models_error_comes_before_the_inputs_errors(
    served: ServerProcess, model: str, version: str, message: str
) -> None:
    for bad, request in cases.http_bad_inputs(model, version):
        assert send_http(served.http_url, request) == {
            "status": 404,
            "body": {"error": message},
        }, bad
    for bad, body in cases.grpc_bad_inputs(model, version):
        request = json_format.ParseDict(body, service_pb2.ModelInferRequest())
        with pytest.raises(grpc.RpcError) as info:
            _stub(served).ModelInfer(request, timeout=30)
        assert (info.value.code(), info.value.details()) == (grpc.StatusCode.NOT_FOUND, message)
        [answer] = list(_stub(served).ModelStreamInfer(iter([request]), timeout=30))
        assert answer.error_message == message, bad
        assert answer.infer_response == service_pb2.ModelInferResponse()


def test_the_inputs_errors_where_the_model_serves(served: ServerProcess) -> None:
    """The same bad inputs to a model that serves them: each refused for its input (so the
    cases above are bad inputs indeed, answered by the model's error alone)."""
    for bad, request in cases.http_bad_inputs("identity_int32", ""):
        answer = send_http(served.http_url, request)
        assert answer["status"] in (400, 404), bad  # 404: the shared memory region
        assert not answer["body"]["error"].startswith("Request for unknown model"), bad
    for bad, body in cases.grpc_bad_inputs("identity_int32", ""):
        request = json_format.ParseDict(body, service_pb2.ModelInferRequest())
        with pytest.raises(grpc.RpcError) as info:
            _stub(served).ModelInfer(request, timeout=30)
        assert not info.value.details().startswith("Request for unknown model"), bad


def test_a_model_with_no_ready_version_refuses_before_the_inputs(served: ServerProcess) -> None:
    message = "Request for unknown model: 'identity_int32' has no available versions"
    assert _http(served, "POST", "/v2/repository/models/identity_int32/unload")["status"] == 200
    try:
        for bad, request in cases.http_bad_inputs("identity_int32", ""):
            answer = send_http(served.http_url, request)
            assert answer == {"status": 404, "body": {"error": message}}, bad
        for bad, body in cases.grpc_bad_inputs("identity_int32", ""):
            request = json_format.ParseDict(body, service_pb2.ModelInferRequest())
            with pytest.raises(grpc.RpcError) as info:
                _stub(served).ModelInfer(request, timeout=30)
            assert info.value.details() == message, bad
            [answer] = list(_stub(served).ModelStreamInfer(iter([request]), timeout=30))
            assert answer.error_message == message, bad
    finally:
        assert _http(served, "POST", "/v2/repository/models/identity_int32/load")["status"] == 200


def test_a_decoupled_model_over_unary_refuses_before_the_inputs(served: ServerProcess) -> None:
    """tritonserver checks the model's transaction policy before it reads the inputs."""
    for bad, request in cases.http_bad_inputs("repeat", ""):
        answer = send_http(served.http_url, request)
        assert answer["status"] == 501, bad
        assert answer["body"]["error"].startswith(
            "HTTP end point doesn't support models with decoupled transaction policy: "
        ), bad
    for bad, body in cases.grpc_bad_inputs("repeat", ""):
        request = json_format.ParseDict(body, service_pb2.ModelInferRequest())
        with pytest.raises(grpc.RpcError) as info:
            _stub(served).ModelInfer(request, timeout=30)
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED, bad
        assert info.value.details().startswith(
            "ModelInfer RPC doesn't support models with decoupled transaction policy: "
        ), bad


def test_a_model_loaded_on_demand_is_not_refused_before_its_inputs(tmp_path: Path) -> None:
    """--model-load-on-demand: a request for a model not loaded yet (which loads on its first
    good request) is not refused for its model; an unknown version of a loaded model is."""
    repository = repo.build(tmp_path / "models", ("identity_int32",))
    proc = ServerProcess(repository, "--model-load-on-demand", log_path=tmp_path / "server.log")
    with proc:
        bad = dict(cases.http_bad_inputs("identity_int32", ""))["byte size mismatch"]
        answer = send_http(proc.http_url, bad)
        assert answer["status"] == 400
        assert "input byte size mismatch for input 'IN'" in answer["body"]["error"]
        good = {"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [1]}]}
        assert _http(proc, "POST", "/v2/models/identity_int32/infer", good)["status"] == 200
        message = "Request for unknown model: 'identity_int32' version 7 is not found"
        for bad, request in cases.http_bad_inputs("identity_int32", "7"):
            answer = send_http(proc.http_url, request)
            assert answer == {"status": 404, "body": {"error": message}}, bad
