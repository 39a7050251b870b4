"""tritonserver's answers that the differential suite (tests/differential/) measured, held here
without the reference: each assertion is what tritonserver 2.51 answers to the same request
(and its current source agrees), on the differential suite's own Python models."""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.differential import repo
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
