"""Scheduling and state behaviours Triton's own qa suites exercise (L0_implicit_state,
L0_sequence_batcher, L0_batch_input, model control), on the real server through tritonclient."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from configs.generate import IR_VERSION, OPSET, save
from tests.serverproc import ServerProcess

MODULES = [httpclient, grpcclient]
IDS = ["http", "grpc"]

# A state with a variable dimension that grows by the request's values: Triton starts it as
# zeros with the -1 dimension as 1 (core's SequenceStates::Initialize).
GROWING_STATE = """\
name: "growing_state"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ { name: "INPUT", data_type: TYPE_INT32, dims: [ -1 ] } ]
output [ { name: "OUTPUT", data_type: TYPE_INT32, dims: [ -1 ] } ]
sequence_batching {
  state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
}
"""


def growing_state_model() -> Any:
    """STATE_OUT = OUTPUT = concat(STATE_IN, INPUT)."""

    def info(name: str) -> Any:
        return helper.make_tensor_value_info(name, TensorProto.INT32, ["n"])

    nodes = [
        helper.make_node("Concat", ["STATE_IN", "INPUT"], ["OUTPUT"], axis=0),
        helper.make_node("Identity", ["OUTPUT"], ["STATE_OUT"]),
    ]
    graph = helper.make_graph(
        nodes,
        "growing_state",
        [info("INPUT"), info("STATE_IN")],
        [info("OUTPUT"), info("STATE_OUT")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    return model


def _repository(root: Path) -> Path:
    models = root / "models"
    save(growing_state_model(), models / "growing_state" / "1" / "model.onnx")
    (models / "growing_state" / "config.pbtxt").write_text(GROWING_STATE)
    return models


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("triton_qa_scheduling")
    proc = ServerProcess(_repository(root), log_path=root / "server.log")
    with proc:
        yield proc


def _int32(module: Any, name: str, data: np.ndarray) -> Any:
    tensor = module.InferInput(name, list(data.shape), "INT32")
    tensor.set_data_from_numpy(data)
    return tensor


@pytest.mark.parametrize("module", MODULES, ids=IDS)
def test_implicit_state_with_a_variable_dimension_starts_as_one_zero(
    server: ServerProcess, module: Any
) -> None:
    client = module.InferenceServerClient(
        server.http_url if module is httpclient else server.grpc_url
    )
    sid = 71 if module is httpclient else 72
    seen = []
    for i, values in enumerate(([5], [6, 7], [8])):
        result = client.infer(
            "growing_state",
            [_int32(module, "INPUT", np.array(values, dtype=np.int32))],
            sequence_id=sid,
            sequence_start=i == 0,
            sequence_end=i == 2,
        )
        seen.append(result.as_numpy("OUTPUT").tolist())
    # The first request's state is [0] (the -1 dimension as 1); then the model's own output.
    assert seen == [[0, 5], [0, 5, 6, 7], [0, 5, 6, 7, 8]]


# A Python model that fails to initialize while its config says so: it fails to load until the
# config is fixed (its version folder stays the same, so its content is the one that failed).
FLAKY_CONFIG = """\
name: "flaky"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 2 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 2 ] }} ]
parameters {{ key: "fail" value: {{ string_value: "{fail}" }} }}
"""

FLAKY_MODEL = """\
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        if config["parameters"]["fail"]["string_value"] == "1":
            raise RuntimeError("configured to fail")

    def execute(self, requests):
        inputs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]) for x in inputs]
"""


@pytest.fixture(scope="module")
def explicit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    root = tmp_path_factory.mktemp("triton_qa_control")
    models = root / "models"
    (models / "flaky" / "1").mkdir(parents=True)
    (models / "flaky" / "1" / "model.py").write_text(FLAKY_MODEL)
    (models / "flaky" / "config.pbtxt").write_text(FLAKY_CONFIG.format(fail="1"))
    proc = ServerProcess(models, "--model-control-mode=explicit", log_path=root / "server.log")
    with proc:
        yield proc, models


@pytest.mark.parametrize("module", MODULES, ids=IDS)
def test_unloading_a_model_never_loaded_succeeds(
    explicit: tuple[ServerProcess, Path], module: Any
) -> None:
    server, _ = explicit
    url = server.http_url if module is httpclient else server.grpc_url
    module.InferenceServerClient(url).unload_model("no_such_model")  # Triton: success


def test_a_load_request_tries_a_failed_version_again(explicit: tuple[ServerProcess, Path]) -> None:
    server, models = explicit
    client = httpclient.InferenceServerClient(server.http_url)
    for _ in range(2):  # each load runs the model's initialize again, as in Triton
        with pytest.raises(InferenceServerException, match="configured to fail"):
            client.load_model("flaky")
    # The config fixed, the same version folder: Triton loads it again, and so here.
    (models / "flaky" / "config.pbtxt").write_text(FLAKY_CONFIG.format(fail="0"))
    client.load_model("flaky")
    assert client.is_model_ready("flaky", "1")
    tensor = httpclient.InferInput("INPUT0", [2], "FP32")
    tensor.set_data_from_numpy(np.array([1.5, 2.5], dtype=np.float32))
    assert client.infer("flaky", [tensor]).as_numpy("OUTPUT0").tolist() == [1.5, 2.5]
