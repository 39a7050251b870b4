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
