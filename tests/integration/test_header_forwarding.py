"""`--http-header-forward-pattern` / `--grpc-header-forward-pattern` on the real server, with
tritonclient: matching headers reach a Python model as string request parameters (HTTP JSON
and binary, the httptools route and aiohttp's for a relayed request, gRPC ModelInfer and
ModelStreamInfer, an ensemble's step), the others do not; case as tritonserver (a
case-insensitive search unless the pattern says `(?-i)`, names as sent); reserved names
refused in tritonserver's words; and without the flags nothing is forwarded (as Triton's
qa/L0_parameters checks it)."""

from __future__ import annotations

import http.client
import json
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.serverproc import ServerProcess

# The request's parameters, as the model sees them (`request.parameters()`), in PARAMS.
PARAMS_MODEL = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = np.array([request.parameters().encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("PARAMS", text)]))
        return responses
"""
PARAMS_DECOUPLED = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            text = np.array([request.parameters().encode()], dtype=np.object_)
            request.get_response_sender().send(
                pb_utils.InferenceResponse([pb_utils.Tensor("PARAMS", text)]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
        return None
"""
PARAMS_CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [ {{ name: "PARAMS", data_type: TYPE_STRING, dims: [ 1 ] }} ]
{extra}
"""
ENSEMBLE = """\
name: "params_ensemble"
platform: "ensemble"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "PARAMS", data_type: TYPE_STRING, dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "params", model_version: -1,
  input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "PARAMS" value: "PARAMS" } } ] }
"""

# Triton's qa/L0_parameters headers: with `MY_HEADER.*` the last three reach the model.
HEADERS = {
    "header_1": "value_1",
    "header_2": "value_2",
    "my_header_1": "my_value_1",
    "my_header_2": "my_value_2",
    "my_header_3": 'This is a "quoted" string with a backslash\\ ',
}
FORWARDED = {k: v for k, v in HEADERS.items() if k.startswith("my_")}
RESERVED = (
    "sequence_id",
    "sequence_start",
    "sequence_end",
    "priority",
    "timeout",
    "headers",
    "binary_data_output",
    "triton_enable_empty_final_response",
    "triton_injected_via_header",
)


def _refusal(name: str) -> str:
    return f"Header '{name}' is reserved for Triton usage and cannot be forwarded."


def _repository(root: Path) -> Path:
    models = root / "models"
    for name, source, extra in (
        ("params", PARAMS_MODEL, ""),
        ("params_decoupled", PARAMS_DECOUPLED, "model_transaction_policy { decoupled: true }"),
    ):
        (models / name / "1").mkdir(parents=True)
        (models / name / "1" / "model.py").write_text(source)
        (models / name / "config.pbtxt").write_text(PARAMS_CONFIG.format(name=name, extra=extra))
    (models / "params_ensemble" / "1").mkdir(parents=True)
    (models / "params_ensemble" / "config.pbtxt").write_text(ENSEMBLE)
    return models


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _repository(tmp_path_factory.mktemp("forwarding"))


def _server(models: Path, name: str, *flags: str) -> Iterator[ServerProcess]:
    with ServerProcess(models, *flags, log_path=models.parent / f"{name}.log") as proc:
        yield proc


@pytest.fixture(scope="module")
def forwarding(models: Path) -> Iterator[ServerProcess]:
    """Triton's test_headers server: both flags `MY_HEADER.*`."""
    yield from _server(
        models,
        "forwarding",
        "--http-header-forward-pattern",
        "MY_HEADER.*",
        "--grpc-header-forward-pattern=MY_HEADER.*",
    )


@pytest.fixture(scope="module")
def everything(models: Path) -> Iterator[ServerProcess]:
    """Triton's test_headers_reserved_rejected server: both flags `.*`."""
    yield from _server(
        models,
        "everything",
        "--http-header-forward-pattern=.*",
        "--grpc-header-forward-pattern=.*",
    )


@pytest.fixture(scope="module")
def case_sensitive(models: Path) -> Iterator[ServerProcess]:
    yield from _server(
        models,
        "case_sensitive",
        "--grpc-header-forward-pattern=(?-i)MY_HEADER.*",
        "--http-header-forward-pattern=(?-i)My_Header.*",
    )


@pytest.fixture(scope="module")
def plain(models: Path) -> Iterator[ServerProcess]:
    """No forwarding flag."""
    yield from _server(models, "plain")


def _inputs(module: Any, binary: bool = True) -> list[Any]:
    tensor = module.InferInput("INPUT0", [1], "FP32")
    if module is httpclient:
        tensor.set_data_from_numpy(np.array([1.0], dtype=np.float32), binary_data=binary)
    else:
        tensor.set_data_from_numpy(np.array([1.0], dtype=np.float32))
    return [tensor]


def _params(result: Any) -> dict[str, Any]:
    text = result.as_numpy("PARAMS")[0]
    return dict(json.loads(text.decode() if isinstance(text, bytes) else text))


def _http(proc: ServerProcess, headers: dict[str, str], **kwargs: Any) -> dict[str, Any]:
    model = kwargs.pop("model", "params")
    binary = kwargs.pop("binary", True)
    with httpclient.InferenceServerClient(proc.http_url) as client:
        # A copy: tritonclient adds its own headers to the dict it is given.
        result = client.infer(model, _inputs(httpclient, binary), headers=dict(headers), **kwargs)
    return _params(result)


def _grpc(proc: ServerProcess, headers: dict[str, str], **kwargs: Any) -> dict[str, Any]:
    with grpcclient.InferenceServerClient(proc.grpc_url) as client:
        result = client.infer("params", _inputs(grpcclient), headers=dict(headers), **kwargs)
    return _params(result)


def _stream_results(proc: ServerProcess, headers: dict[str, str], models: list[str]) -> list[Any]:
    answers: queue.Queue[Any] = queue.Queue()
    results: list[Any] = []
    with grpcclient.InferenceServerClient(proc.grpc_url) as client:
        client.start_stream(
            lambda result, error: answers.put(error or result), headers=dict(headers)
        )
        try:
            for model in models:
                client.async_stream_infer(model, _inputs(grpcclient))
                answer = answers.get(timeout=30)
                results.append(answer if isinstance(answer, Exception) else _params(answer))
        finally:
            client.stop_stream()
    return results


def _forwarded(params: dict[str, Any]) -> dict[str, Any]:
    """The parameters a header could have given (every name of HEADERS has `header`)."""
    return {k: v for k, v in params.items() if "header" in k.lower()}


# ---- matching headers reach the model -----------------------------------------------------


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("compression", [None, "gzip"], ids=["httptools", "relayed"])
def test_http_matching_headers_reach_the_model(
    forwarding: ServerProcess, binary: bool, compression: str | None
) -> None:
    """Binary and JSON bodies, on the httptools route and (a compressed body) relayed to
    aiohttp's: the matching headers join the request's own parameters."""
    params = _http(
        forwarding,
        HEADERS,
        binary=binary,
        parameters={"key1": "value1", "key2": 2},
        request_compression_algorithm=compression,
    )
    assert _forwarded(params) == FORWARDED
    assert params["key1"] == "value1"
    assert params["key2"] == 2


def test_http_names_reach_the_model_as_sent(forwarding: ServerProcess) -> None:
    """tritonserver gives the header's name as the client wrote it, matched case-insensitively."""
    body = json.dumps(
        {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.0]}]}
    )
    connection = http.client.HTTPConnection(forwarding.http_url, timeout=30)
    try:
        connection.request(
            "POST",
            "/v2/models/params/infer",
            body,
            {"My_Header_Case": "Mixed", "MY_HEADER_UPPER": "upper", "Header_1": "no"},
        )
        answer = connection.getresponse()
        doc = json.loads(answer.read())
    finally:
        connection.close()
    assert answer.status == 200, doc
    params = json.loads(doc["outputs"][0]["data"][0])
    assert _forwarded(params) == {"My_Header_Case": "Mixed", "MY_HEADER_UPPER": "upper"}


def test_http_forwarded_headers_pass_through_an_ensemble(forwarding: ServerProcess) -> None:
    params = _http(forwarding, HEADERS, model="params_ensemble", parameters={"key1": "v"})
    assert _forwarded(params) == FORWARDED
    assert params["key1"] == "v"


def test_grpc_matching_metadata_reaches_the_model(forwarding: ServerProcess) -> None:
    params = _grpc(forwarding, HEADERS, parameters={"key1": "value1"})
    assert _forwarded(params) == FORWARDED
    assert params["key1"] == "value1"


def test_grpc_stream_metadata_reaches_every_request(forwarding: ServerProcess) -> None:
    """The stream's metadata, on each of its requests: one the handler thread runs and one of
    a decoupled model, which runs on the loop."""
    results = _stream_results(forwarding, HEADERS, ["params", "params_decoupled", "params"])
    assert [_forwarded(r) for r in results] == [FORWARDED] * 3


# ---- case ----------------------------------------------------------------------------------


def test_a_case_sensitive_pattern_forwards_only_exact_case(case_sensitive: ServerProcess) -> None:
    """`(?-i)` turns tritonserver's case-insensitivity off: gRPC metadata keys are lower case
    on the wire, so `(?-i)MY_HEADER.*` forwards none of them (Triton's
    test_grpc_header_forward_pattern_case_sensitive); over HTTP the name as sent decides."""
    assert _forwarded(_grpc(case_sensitive, HEADERS)) == {}
    assert [_forwarded(r) for r in _stream_results(case_sensitive, HEADERS, ["params"])] == [{}]
    connection = http.client.HTTPConnection(case_sensitive.http_url, timeout=30)
    body = json.dumps(
        {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.0]}]}
    )
    try:
        connection.request(
            "POST",
            "/v2/models/params/infer",
            body,
            {"My_Header_A": "a", "my_header_b": "b", "MY_HEADER_C": "c"},
        )
        doc = json.loads(connection.getresponse().read())
    finally:
        connection.close()
    assert _forwarded(json.loads(doc["outputs"][0]["data"][0])) == {"My_Header_A": "a"}


# ---- reserved names ------------------------------------------------------------------------


@pytest.mark.parametrize("name", RESERVED)
def test_a_reserved_header_is_refused_in_tritons_words(
    everything: ServerProcess, name: str
) -> None:
    """HTTP (the httptools route, and relayed) 400 and gRPC INVALID_ARGUMENT, with
    tritonserver's text; on a stream, every request's in-band error."""
    headers = {name: "dummy-value"}
    for compression in (None, "gzip"):
        with pytest.raises(InferenceServerException) as info:
            _http(everything, headers, request_compression_algorithm=compression)
        assert info.value.status() == "400"
        assert info.value.message() == _refusal(name)
    with pytest.raises(InferenceServerException) as info:
        _grpc(everything, headers)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert info.value.message() == _refusal(name)
    results = _stream_results(everything, headers, ["params", "params_decoupled"])
    assert [str(r.message()) for r in results] == [_refusal(name)] * 2


def test_with_everything_forwarded_the_clients_own_headers_arrive(
    everything: ServerProcess,
) -> None:
    """`.*`: every header the client sent (its user agent among them) reaches the model."""
    http_params = _http(everything, {"x-tenant": "acme"})
    assert http_params["x-tenant"] == "acme"
    assert {k.lower() for k in http_params} >= {"host", "user-agent", "content-length"}
    grpc_params = _grpc(everything, {"x-tenant": "acme"})
    assert grpc_params["x-tenant"] == "acme"
    assert "grpc" in grpc_params["user-agent"]


def test_the_start_says_what_is_forwarded(forwarding: ServerProcess, plain: ServerProcess) -> None:
    for what in ("HTTP headers", "gRPC metadata keys"):
        assert f"Forwarding {what} matching 'MY_HEADER.*' to models" in forwarding.log()
        assert f"Forwarding {what}" not in plain.log()


@pytest.mark.parametrize("flag", ["--http-header-forward-pattern", "--grpc-header-forward-pattern"])
def test_a_pattern_that_does_not_compile_stops_the_start(
    models: Path, tmp_path: Path, flag: str
) -> None:
    proc = ServerProcess(models, f"{flag}=MY_(HEADER", log_path=tmp_path / "server.log")
    try:
        code = proc.proc.wait(timeout=60)
    finally:
        proc.stop()
    assert code != 0
    assert f"{flag} 'MY_(HEADER' is not a usable regular expression: missing )" in proc.log()


# ---- without the flags ---------------------------------------------------------------------


def test_without_the_flags_nothing_is_forwarded(plain: ServerProcess) -> None:
    headers = {**HEADERS, "priority": "1", "triton_x": "y"}  # not refused either
    assert _forwarded(_http(plain, headers)) == {}
    assert _forwarded(_http(plain, headers, request_compression_algorithm="gzip")) == {}
    assert "priority" not in _http(plain, headers)
    assert _forwarded(_grpc(plain, headers)) == {}
    results = _stream_results(plain, headers, ["params", "params_decoupled"])
    assert [_forwarded(r) for r in results] == [{}, {}]
