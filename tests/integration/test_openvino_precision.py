"""OpenVINO infers in f32 on every CPU unless the model's config asks for bf16 (HINT_BF16).

OpenVINO's CPU plugin picks bf16 by default on CPUs with AVX512_BF16 or AMX. bf16 keeps 8
significant bits, so large logits that differ by less than their ulp (8 at 1,000; 6.7e7 at
1e10) round to the same value or a whole ulp apart, and the softmax over them becomes uniform
or a step with zeros elsewhere: what served all-zero outputs from the onnx wheel's light
SqueezeNet (constant weights, logits about 1e10) on a Xeon with AMX. The model here is that
failure in two nodes: near-equal logits of about 1,000, then a softmax.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper, numpy_helper

from configs.generate import OPSET, save
from edge_backends.api import InstanceSpec
from tests.serverproc import ServerProcess

ov = pytest.importorskip("openvino", reason="openvino is not installed (extra 'openvino')")
ov_hints = pytest.importorskip("openvino.properties.hint")

CLASSES = 8
# Logits 1000 + j/4 for class j: one bf16 ulp at 1000 is 4, so bf16 cannot tell them apart.
INPUT = np.array([[1000.0, 1.0]], np.float32)


def _logits_model() -> Any:
    weights = np.ones((2, CLASSES), np.float32)
    weights[1] = np.arange(CLASSES, dtype=np.float32) / 4
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["INPUT0", "W"], ["logits"]),
            helper.make_node("Softmax", ["logits"], ["OUTPUT0"], axis=-1),
        ],
        "near_equal_logits",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", CLASSES])],
        [numpy_helper.from_array(weights, "W")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def _config(name: str, hint_bf16: str | None) -> str:
    text = (
        f'name: "{name}"\nbackend: "openvino"\nmax_batch_size: 4\n'
        'default_model_filename: "model.onnx"\n'
        'input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 2 ] } ]\n'
        f'output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ {CLASSES} ] }} ]\n'
    )
    if hint_bf16 is not None:
        text += f'parameters {{ key: "HINT_BF16" value {{ string_value: "{hint_bf16}" }} }}\n'
    return text


def _cpu_has_bf16() -> bool:
    return "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ov_precision")
    for name, hint in (("ov_default", None), ("ov_f32", "NO"), ("ov_bf16", "YES")):
        save(_logits_model(), root / name / "1" / "model.onnx")
        (root / name / "config.pbtxt").write_text(_config(name, hint))
    return root


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(repo, log_path=tmp_path_factory.mktemp("ov_prec") / "server.log")
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def _reference(repo: Path) -> np.ndarray[Any, Any]:
    path = str(repo / "ov_default" / "1" / "model.onnx")
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return np.asarray(session.run(["OUTPUT0"], {"INPUT0": INPUT})[0])


def _compiled_precision(repo: Path, name: str, parameters: dict[str, str]) -> str:
    """The inference precision the backend's compiled model reports (its own property)."""
    from edge_backends.openvino_backend import OpenVinoBackend

    backend = OpenVinoBackend()
    spec = InstanceSpec(
        model_name=name,
        model_version=1,
        model_path=repo / "ov_default" / "1" / "model.onnx",
        instance_name=f"{name}_0",
        parameters=parameters,
        model_config={"max_batch_size": 4},
    )
    instance = backend.create_instance(spec)
    try:
        # The compiled model is the backend's own: read what OpenVINO says it compiled for.
        compiled = instance._shared.compiled
        return str(compiled.get_property(ov_hints.inference_precision()).get_type_name())
    finally:
        instance.close()


def test_the_precision_hint_is_f32_by_default(repo: Path) -> None:
    assert _compiled_precision(repo, "default", {}) == "f32"
    assert _compiled_precision(repo, "no", {"HINT_BF16": "NO"}) == "f32"


def test_hint_bf16_in_the_config_is_honoured(repo: Path) -> None:
    # Where the CPU has no bf16, OpenVINO runs f32 whatever is asked.
    expected = "bf16" if _cpu_has_bf16() else "f32"
    assert _compiled_precision(repo, "yes", {"HINT_BF16": "YES"}) == expected


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_served_outputs_match_onnxruntime_on_any_cpu(
    server: ServerProcess, repo: Path, protocol: str
) -> None:
    expected = _reference(repo)
    assert float(expected.max() - expected.min()) > 0.1  # the classes differ in f32
    module: Any = httpclient if protocol == "http" else grpcclient
    url = server.http_url if protocol == "http" else server.grpc_url
    client = module.InferenceServerClient(url)
    for model in ("ov_default", "ov_f32"):
        inp = module.InferInput("INPUT0", [1, 2], "FP32")
        inp.set_data_from_numpy(INPUT)
        got = client.infer(model, [inp]).as_numpy("OUTPUT0")
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6, err_msg=model)


def test_the_load_log_says_which_precision(server: ServerProcess) -> None:
    log = server.log()
    assert "model 'ov_default' version 1: openvino compiled for CPU" in log
    lines = {
        name: next(line for line in log.splitlines() if f"'{name}' version 1: openvino" in line)
        for name in ("ov_default", "ov_f32", "ov_bf16")
    }
    assert lines["ov_default"].endswith("precision f32")
    assert lines["ov_f32"].endswith("precision f32")
    assert lines["ov_bf16"].endswith("precision bf16" if _cpu_has_bf16() else "precision f32")
