"""GPU or CPU, decided per model and reported: a machine without a usable GPU serves what it
can on CPU and says so in the repository index, the model config, the log and the metrics."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from appliance.runtime.placement import tensorrt_problem
from configs.generate import SIMPLE_CONFIG, save, simple_model
from tests.serverproc import ServerProcess

pytestmark = pytest.mark.skipif(
    not tensorrt_problem(), reason="this machine can run TensorRT engines: no fallback to test"
)

GPU_GROUP = 'instance_group [ { kind: KIND_GPU, count: 1, gpus: [ 0 ] } ]\n'


def _trt_config(name: str, extra: str = "") -> str:
    return (
        SIMPLE_CONFIG.replace('"simple"', f'"{name}"').replace(
            'platform: "onnxruntime_onnx"', 'platform: "tensorrt_plan"'
        )
        + GPU_GROUP
        + extra
    )


def _repository(root: Path) -> Path:
    engine = b"not a real engine: TensorRT never reads it on a machine without a GPU"
    layouts: dict[str, tuple[str, dict[int, tuple[str, ...]]]] = {
        # A TensorRT model shipped with its ONNX source: served from the ONNX file on CPU.
        "trt_with_onnx": (_trt_config("trt_with_onnx"), {1: ("model.plan", "model.onnx")}),
        # Only an engine: cannot be served here.
        "trt_only": (_trt_config("trt_only"), {1: ("model.plan",)}),
        # Version 1 has the ONNX file, version 2 only an engine.
        "trt_mixed": (
            _trt_config("trt_mixed", "version_policy: { all {} }\n"),
            {1: ("model.plan", "model.onnx"), 2: ("model.plan",)},
        ),
        # KIND_AUTO: GPU where there is one, else CPU, without a warning.
        "auto_kind": (
            SIMPLE_CONFIG.replace('"simple"', '"auto_kind"')
            + "instance_group [ { kind: KIND_AUTO, count: 2 } ]\n",
            {1: ("model.onnx",)},
        ),
    }
    for name, (config, versions) in layouts.items():
        (root / name).mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config)
        for version, files in versions.items():
            folder = root / name / str(version)
            folder.mkdir()
            for filename in files:
                if filename == "model.onnx":
                    save(simple_model(), folder / filename)
                else:
                    (folder / filename).write_bytes(engine)
    return root


@pytest.fixture(scope="module")
def fallback_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = _repository(tmp_path_factory.mktemp("gpu_fallback"))
    proc = ServerProcess(root, log_path=tmp_path_factory.mktemp("logs") / "server.log")
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def _infer(client: httpclient.InferenceServerClient, model: str, version: str = "") -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(a)
    result = client.infer(model, inputs, model_version=version)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)


def test_tensorrt_model_is_served_from_its_onnx_file(fallback_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(fallback_server.http_url)
    assert client.is_model_ready("trt_with_onnx")
    _infer(client, "trt_with_onnx")
    index = {e["name"]: e for e in client.get_model_repository_index()}
    assert index["trt_with_onnx"]["state"] == "READY"
    assert "TensorRT cannot run here" in index["trt_with_onnx"]["reason"]
    assert "serving model.onnx of version(s) 1 with onnxruntime on CPU" in (
        index["trt_with_onnx"]["reason"]
    )
    config = client.get_model_config("trt_with_onnx")
    assert config["platform"] == "onnxruntime_onnx"
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    # The same over gRPC.
    grpc = grpcclient.InferenceServerClient(fallback_server.grpc_url)
    served = grpc.get_model_config("trt_with_onnx").config
    assert served.platform == "onnxruntime_onnx"
    assert "TensorRT cannot run here" in fallback_server.log()


def test_tensorrt_only_model_fails_with_the_reason(fallback_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(fallback_server.http_url)
    assert not client.is_model_ready("trt_only")
    index = {e["name"]: e for e in client.get_model_repository_index()}
    assert index["trt_only"]["state"] == "UNAVAILABLE"
    reason = index["trt_only"]["reason"]
    assert "TensorRT engines cannot run here" in reason
    assert "tensorrt" in reason  # which library or device is missing
    _infer(client, "trt_with_onnx")  # everything else keeps serving


def test_versions_without_an_onnx_file_fail_alone(fallback_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(fallback_server.http_url)
    assert client.is_model_ready("trt_mixed", "1")
    assert not client.is_model_ready("trt_mixed", "2")
    _infer(client, "trt_mixed", "1")
    index = {(e["name"], e.get("version")): e for e in client.get_model_repository_index()}
    assert "version 2 has no model.onnx" in index[("trt_mixed", "2")]["reason"]


def test_kind_auto_runs_on_cpu_without_a_warning(fallback_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(fallback_server.http_url)
    _infer(client, "auto_kind")
    config = client.get_model_config("auto_kind")
    assert [g["kind"] for g in config["instance_group"]] == ["KIND_CPU"]
    index = {e["name"]: e for e in client.get_model_repository_index()}
    assert "reason" not in index["auto_kind"]  # READY: no reason, as tritonserver
    assert "auto_kind" not in "\n".join(
        line for line in fallback_server.log().splitlines() if "WARNING" in line
    )


def test_placement_is_in_the_metrics(fallback_server: ServerProcess) -> None:
    url = f"http://127.0.0.1:{fallback_server.metrics_port}/metrics"
    text = requests.get(url, timeout=10).text
    lines = [line for line in text.splitlines() if line.startswith("edge_model_instances{")]

    def wanted(model: str, version: str, kind: str, backend: str) -> str:
        labels = f'backend="{backend}",kind="{kind}",model="{model}",version="{version}"'
        return f"edge_model_instances{{{labels}}}"

    assert f"{wanted('auto_kind', '1', 'KIND_CPU', 'onnxruntime')} 2.0" in lines
    assert f"{wanted('trt_with_onnx', '1', 'KIND_CPU', 'onnxruntime')} 1.0" in lines
    assert not any('kind="KIND_GPU"' in line for line in lines)
