"""Health, metadata, config, statistics and repository endpoints through all four clients."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.utils import InferenceServerException

from tests.serverproc import ServerProcess


def simple_inputs(module, binary: bool = True):  # type: ignore[no-untyped-def]
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    inputs = [
        module.InferInput("INPUT0", [1, 16], "INT32"),
        module.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    if module in (httpclient, httpaio):
        inputs[0].set_data_from_numpy(a, binary_data=binary)
        inputs[1].set_data_from_numpy(b, binary_data=binary)
    else:
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
    return inputs, a, b


def test_http_health_and_server_metadata(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "triton"  # what Triton's own clients check
    assert {"binary_tensor_data", "classification", "statistics", "model_repository"} <= set(
        meta["extensions"]
    )


def test_grpc_health_and_server_metadata(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "triton"  # what Triton's own clients check
    assert "binary_tensor_data" in meta["extensions"]


def test_the_id_flag_names_the_server_in_its_metadata(start_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """tritonserver's --id: a fleet's tools can tell which device answers."""
    repo = tmp_path / "empty"
    repo.mkdir()
    proc = start_server(repo, "--id=device-0042")
    assert httpclient.InferenceServerClient(proc.http_url).get_server_metadata()["name"] == (
        "device-0042"
    )
    grpc = grpcclient.InferenceServerClient(proc.grpc_url)
    assert grpc.get_server_metadata(as_json=True)["name"] == "device-0042"


@pytest.mark.parametrize("path", ["/v2/models/simple", "/v2/models/simple/versions/1"])
def test_http_model_metadata(server: ServerProcess, path: str) -> None:
    with urllib.request.urlopen(f"http://{server.http_url}{path}") as resp:
        meta = json.load(resp)
    assert meta["name"] == "simple"
    assert meta["versions"] == ["1"]
    assert meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [
        {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]},
        {"name": "INPUT1", "datatype": "INT32", "shape": [-1, 16]},
    ]
    assert [o["name"] for o in meta["outputs"]] == ["OUTPUT0", "OUTPUT1"]


def test_grpc_model_metadata_and_config(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    meta = client.get_model_metadata("simple")
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [
        ("INPUT0", "INT32", [-1, 16]),
        ("INPUT1", "INT32", [-1, 16]),
    ]
    config = client.get_model_config("simple").config
    assert config.max_batch_size == 8
    assert [i.name for i in config.input] == ["INPUT0", "INPUT1"]


def test_http_model_config_uses_proto_names_and_numbers(server: ServerProcess) -> None:
    config = httpclient.InferenceServerClient(server.http_url).get_model_config("simple")
    assert config["name"] == "simple"
    assert config["max_batch_size"] == 8
    assert config["input"][0]["data_type"] == "TYPE_INT32"
    assert config["input"][0]["dims"] == [16]  # numbers, as Triton writes them
    assert config["instance_group"][0]["kind"] == "KIND_CPU"


def test_model_ready(server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    assert http.is_model_ready("simple")
    assert grpc.is_model_ready("simple", "1")
    assert not http.is_model_ready("simple", "2")
    assert not grpc.is_model_ready("no_such_model")
    assert not http.is_model_ready("broken_model_file")


def test_sync_clients_infer_simple(server: ServerProcess) -> None:
    for module, url in ((httpclient, server.http_url), (grpcclient, server.grpc_url)):
        client = module.InferenceServerClient(url)
        inputs, a, b = simple_inputs(module)
        result = client.infer("simple", inputs, request_id="req-7")
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
        response = result.get_response()
        response_id = response["id"] if isinstance(response, dict) else response.id
        assert response_id == "req-7"


async def test_async_clients_infer_simple(server: ServerProcess) -> None:
    for module, url in ((httpaio, server.http_url), (grpcaio, server.grpc_url)):
        client = module.InferenceServerClient(url)
        try:
            assert await client.is_server_ready()
            inputs, a, b = simple_inputs(module)
            outputs = [module.InferRequestedOutput("OUTPUT1")]
            result = await client.infer("simple", inputs, outputs=outputs)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
            assert result.as_numpy("OUTPUT0") is None  # only what was asked for
        finally:
            await client.close()


def test_http_json_tensors(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    inputs, a, b = simple_inputs(httpclient, binary=False)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)]
    result = client.infer("simple", inputs, outputs=outputs)
    assert result.get_response()["outputs"][0]["data"] == (a + b).ravel().tolist()


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_http_compression_both_ways(server: ServerProcess, algorithm: str) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    inputs, a, b = simple_inputs(httpclient)
    result = client.infer(
        "simple",
        inputs,
        request_compression_algorithm=algorithm,
        response_compression_algorithm=algorithm,
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


@pytest.mark.parametrize(
    ("accept", "expected"), [("gzip", "gzip"), ("deflate", "deflate"), ("", None)]
)
def test_large_responses_are_compressed_when_asked(
    server: ServerProcess, accept: str, expected: str | None
) -> None:
    body = json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4096], "data": [0.0] * 4096}
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/identity_fp32/infer",
        data=body,
        method="POST",
        headers={"Accept-Encoding": accept} if accept else {},
    )
    with urllib.request.urlopen(request) as resp:
        assert resp.headers.get("Content-Encoding") == expected
        raw = resp.read()
    if expected:
        assert len(raw) < 4096  # 16 KiB of zeros compress well


def test_grpc_stream_infer(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: list[tuple[object, object]] = []
    client.start_stream(callback=lambda result, error: results.append((result, error)))
    try:
        for i in range(5):
            inputs, a, b = simple_inputs(grpcclient)
            client.async_stream_infer("simple", inputs, request_id=str(i))
        bad = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        bad.set_data_from_numpy(np.zeros((1, 16), np.float32))
        client.async_stream_infer("simple", [bad], request_id="bad")
    finally:
        client.stop_stream()  # waits for the outstanding responses
    assert len(results) == 6
    good = {r.get_response().id: r for r, e in results if e is None}
    assert sorted(good) == ["0", "1", "2", "3", "4"]
    np.testing.assert_array_equal(good["3"].as_numpy("OUTPUT0"), a + b)
    errors = [e for _, e in results if e is not None]
    assert len(errors) == 1
    assert "data-type is 'FP32'" in str(errors[0])


def test_statistics_count_inferences(server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(server.http_url)
    before = http.get_inference_statistics("identity_int64")["model_stats"][0]
    data = np.arange(6, dtype=np.int64).reshape(3, 2)
    inp = httpclient.InferInput("INPUT0", [3, 2], "INT64")
    inp.set_data_from_numpy(data)
    for _ in range(2):
        http.infer("identity_int64", [inp])
    after = http.get_inference_statistics("identity_int64", "1")["model_stats"][0]
    assert after["name"] == "identity_int64"
    assert after["version"] == "1"
    assert after["inference_count"] - before["inference_count"] == 6  # 2 requests x batch 3
    assert after["execution_count"] - before["execution_count"] == 2
    stats = after["inference_stats"]
    assert stats["success"]["count"] - before["inference_stats"]["success"]["count"] == 2
    assert stats["compute_infer"]["ns"] > 0
    assert any(b["batch_size"] == 3 for b in after["batch_stats"])
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    grpc_stats = grpc.get_inference_statistics("identity_int64", as_json=True)["model_stats"][0]
    assert int(grpc_stats["inference_count"]) == after["inference_count"]
    every = http.get_inference_statistics()["model_stats"]
    assert {"simple", "identity_int64"} <= {s["name"] for s in every}


def test_a_request_its_checks_refuse_is_not_a_failure(server: ServerProcess) -> None:
    """As tritonserver (measured by tests/differential/): a request refused before its
    scheduler (a wrong shape) is not counted in the model's statistics."""
    http = httpclient.InferenceServerClient(server.http_url)
    before = http.get_inference_statistics("simple")["model_stats"][0]["inference_stats"]
    bad = httpclient.InferInput("INPUT0", [1, 8], "INT32")
    bad.set_data_from_numpy(np.zeros((1, 8), np.int32))
    good = httpclient.InferInput("INPUT1", [1, 16], "INT32")
    good.set_data_from_numpy(np.zeros((1, 16), np.int32))
    with pytest.raises(InferenceServerException, match="unexpected shape for input 'INPUT0'"):
        http.infer("simple", [bad, good])
    after = http.get_inference_statistics("simple")["model_stats"][0]["inference_stats"]
    assert after["fail"]["count"] == before["fail"]["count"]


def test_repository_index(server: ServerProcess) -> None:
    index = httpclient.InferenceServerClient(server.http_url).get_model_repository_index()
    by_name = {e["name"]: e for e in index}
    assert by_name["simple"]["state"] == "READY"
    assert by_name["simple"]["version"] == "1"
    assert by_name["broken_model_file"]["state"] == "UNAVAILABLE"
    assert "onnxruntime cannot load" in by_name["broken_model_file"]["reason"]
    grpc_index = grpcclient.InferenceServerClient(server.grpc_url).get_model_repository_index()
    assert {m.name for m in grpc_index.models} == set(by_name)


def test_load_and_unload_refused_outside_explicit_mode(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException, match="not allowed if polling is enabled"):
        client.unload_model("simple")
    assert client.is_model_ready("simple")


def test_cuda_shared_memory_without_a_gpu_says_why(server: ServerProcess) -> None:
    """No CUDA device here: status lists nothing, registering is UNSUPPORTED with the reason,
    malformed handles are the client's fault, and the server keeps serving."""
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    assert http.get_cuda_shared_memory_status() == []
    assert not grpc.get_cuda_shared_memory_status().regions
    handle = base64.b64encode(bytes(64)).decode()
    with pytest.raises(InferenceServerException, match="no usable CUDA device 0") as err:
        http.register_cuda_shared_memory("gpu_in", handle, 0, 64)
    assert err.value.status() == "501"
    with pytest.raises(InferenceServerException, match="no usable CUDA device 0") as gerr:
        grpc.register_cuda_shared_memory("gpu_in", base64.b64decode(handle), 0, 64)
    assert gerr.value.status() == "StatusCode.UNIMPLEMENTED"
    bad = urllib.request.Request(
        f"http://{server.http_url}/v2/cudasharedmemory/region/x/register",
        data=json.dumps({"raw_handle": {"b64": "not base64!"}, "byte_size": 64}).encode(),
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as bad_err:
        urllib.request.urlopen(bad)
    assert bad_err.value.code == 400
    assert "raw_handle.b64 is not base64" in bad_err.value.read().decode()
    http.unregister_cuda_shared_memory()
    grpc.unregister_cuda_shared_memory("gpu_in")
    assert http.get_cuda_shared_memory_status() == []
    assert http.is_server_ready()


def test_server_metadata_build_object(server: ServerProcess) -> None:
    with urllib.request.urlopen(f"http://{server.http_url}/v2") as resp:
        meta = json.load(resp)
    assert meta["name"] == "triton"
    assert {"version", "commit", "python", "platform"} <= set(meta["build"])
    # tritonclient takes the extra object in its stride; the gRPC message has no such field.
    assert httpclient.InferenceServerClient(server.http_url).get_server_metadata() == meta
    grpc_meta = grpcclient.InferenceServerClient(server.grpc_url).get_server_metadata(as_json=True)
    assert set(grpc_meta) == {"name", "version", "extensions"}
    assert grpc_meta["version"] == meta["version"] == meta["build"]["version"]
