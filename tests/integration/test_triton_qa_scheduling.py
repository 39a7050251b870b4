"""Scheduling and state behaviours Triton's own qa suites exercise (L0_implicit_state,
L0_sequence_batcher, L0_batch_input, model control), on the real server through tritonclient."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from configs.generate import IR_VERSION, OPSET, identity_model, save
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
    save(ragged_onnx_model(), models / "ragged_onnx" / "1" / "model.onnx")
    (models / "ragged_onnx" / "config.pbtxt").write_text(RAGGED_ONNX)
    save(identity_model(TensorProto.FLOAT, ["n"]), models / "ragged_io" / "1" / "model.onnx")
    (models / "ragged_io" / "config.pbtxt").write_text(RAGGED_IO)
    (models / "ragged_python" / "1").mkdir(parents=True)
    (models / "ragged_python" / "1" / "model.py").write_text(RAGGED_PYTHON_MODEL)
    (models / "ragged_python" / "config.pbtxt").write_text(RAGGED_PYTHON)
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


# Ragged batching (L0_batch_input's kinds): requests of different shapes batch together; the
# model gets the ragged input as one 1-D tensor and the batch inputs the server makes. Every
# output row of this model shows the whole batch: a request sees what its batch was.
RAGGED_ONNX = """\
name: "ragged_onnx"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT", data_type: TYPE_FP32, dims: [ -1 ], allow_ragged_batch: true } ]
output [
  { name: "FLAT", data_type: TYPE_FP32, dims: [ -1 ] },
  { name: "COUNT", data_type: TYPE_FP32, dims: [ -1 ] },
  { name: "ACC", data_type: TYPE_INT32, dims: [ -1 ] },
  { name: "ACC0", data_type: TYPE_FP32, dims: [ -1 ] },
  { name: "MAX", data_type: TYPE_FP32, dims: [ -1 ] },
  { name: "ITEM", data_type: TYPE_FP32, dims: [ 1 ] },
  { name: "FLAT_ITEMS", data_type: TYPE_FP32, dims: [ -1 ] }
]
batch_input [
  { kind: BATCH_ELEMENT_COUNT, target_name: "B_COUNT",
    data_type: TYPE_FP32, source_input: "INPUT" },
  { kind: BATCH_ACCUMULATED_ELEMENT_COUNT, target_name: "B_ACC",
    data_type: TYPE_INT32, source_input: "INPUT" },
  { kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO, target_name: "B_ACC0",
    data_type: TYPE_FP32, source_input: "INPUT" },
  { kind: BATCH_MAX_ELEMENT_COUNT_AS_SHAPE, target_name: "B_MAX",
    data_type: TYPE_FP32, source_input: "INPUT" },
  { kind: BATCH_ITEM_SHAPE, target_name: "B_ITEM", data_type: TYPE_FP32, source_input: "INPUT" },
  { kind: BATCH_ITEM_SHAPE_FLATTEN, target_name: "B_FLAT",
    data_type: TYPE_FP32, source_input: "INPUT" }
]
dynamic_batching { preferred_batch_size: [ 3 ], max_queue_delay_microseconds: 30000000 }
"""


def ragged_onnx_model() -> Any:
    """Each output row: a batch input (or the 1-D ragged input), one row per request."""
    fp32, int32 = TensorProto.FLOAT, TensorProto.INT32
    nodes = [helper.make_node("Shape", ["B_COUNT"], ["rows"])]  # [requests]: batch 1 each
    outputs = []
    for source, name, elem in (
        ("INPUT", "FLAT", fp32),
        ("B_COUNT", "COUNT", fp32),
        ("B_ACC", "ACC", int32),
        ("B_ACC0", "ACC0", fp32),
        ("B_MAX", "MAX", fp32),
        ("B_FLAT", "FLAT_ITEMS", fp32),
    ):
        nodes += [
            helper.make_node("Shape", [source], [f"{name}_len"]),
            helper.make_node("Concat", ["rows", f"{name}_len"], [f"{name}_shape"], axis=0),
            helper.make_node("Unsqueeze", [source, "zero"], [f"{name}_row"]),
            helper.make_node("Expand", [f"{name}_row", f"{name}_shape"], [name]),
        ]
        outputs.append(helper.make_tensor_value_info(name, elem, ["b", "n"]))
    nodes.append(helper.make_node("Identity", ["B_ITEM"], ["ITEM"]))
    outputs.append(helper.make_tensor_value_info("ITEM", fp32, ["b", 1]))
    inputs = [
        helper.make_tensor_value_info("INPUT", fp32, ["n"]),
        helper.make_tensor_value_info("B_COUNT", fp32, ["r"]),
        helper.make_tensor_value_info("B_ACC", int32, ["r"]),
        helper.make_tensor_value_info("B_ACC0", fp32, ["r1"]),
        helper.make_tensor_value_info("B_MAX", fp32, ["m"]),
        helper.make_tensor_value_info("B_ITEM", fp32, ["b", 1]),
        helper.make_tensor_value_info("B_FLAT", fp32, ["f"]),
    ]
    zero = helper.make_tensor("zero", TensorProto.INT64, [1], [0])
    graph = helper.make_graph(nodes, "ragged", inputs, outputs, initializer=[zero])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    return model


# L0_batch_input's ragged_io: an identity model gets the ragged input as one 1-D tensor, and
# `batch_output` cuts its output back into each request's shape.
RAGGED_IO = """\
name: "ragged_io"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ], allow_ragged_batch: true } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
batch_output [
  { target_name: "OUTPUT0", kind: BATCH_SCATTER_WITH_INPUT_SHAPE, source_input: "INPUT0" }
]
dynamic_batching { preferred_batch_size: [ 3 ], max_queue_delay_microseconds: 30000000 }
"""


# The same batching for a Python model: it gets each request's own tensors (no batch inputs,
# as Triton's Python backend) and says how many requests its execute() had.
RAGGED_PYTHON = """\
name: "ragged_python"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT", data_type: TYPE_FP32, dims: [ -1 ], allow_ragged_batch: true } ]
output [
  { name: "OUTPUT", data_type: TYPE_FP32, dims: [ -1 ] },
  { name: "REQUESTS", data_type: TYPE_INT32, dims: [ 1 ] }
]
batch_input [
  { kind: BATCH_ACCUMULATED_ELEMENT_COUNT, target_name: "INDEX",
    data_type: TYPE_FP32, source_input: "INPUT" }
]
dynamic_batching { preferred_batch_size: [ 3 ], max_queue_delay_microseconds: 30000000 }
"""

RAGGED_PYTHON_MODEL = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            assert pb_utils.get_input_tensor_by_name(request, "INDEX") is None
            x = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            count = np.array([[len(requests)]], dtype=np.int32)
            tensors = [pb_utils.Tensor("OUTPUT", x * 2), pb_utils.Tensor("REQUESTS", count)]
            responses.append(pb_utils.InferenceResponse(tensors))
        return responses
"""


def _ragged_batch(
    server: ServerProcess, module: Any, model: str, outputs: list[str], name: str = "INPUT"
) -> list[Any]:
    """Three concurrent requests of shapes [1, 2], [1, 3], [1, 1]: one batch of three."""
    url = server.http_url if module is httpclient else server.grpc_url

    def call(n: int) -> Any:
        tensor = module.InferInput(name, [1, n], "FP32")
        tensor.set_data_from_numpy(np.full((1, n), n, dtype=np.float32))
        result = module.InferenceServerClient(url).infer(model, [tensor])
        return {name: result.as_numpy(name).tolist() for name in outputs}

    with ThreadPoolExecutor(3) as pool:
        return list(pool.map(call, (2, 3, 1)))


@pytest.mark.parametrize("module", MODULES, ids=IDS)
def test_ragged_inputs_batch_together_with_their_batch_inputs(
    server: ServerProcess, module: Any
) -> None:
    names = ["FLAT", "COUNT", "ACC", "ACC0", "MAX", "ITEM", "FLAT_ITEMS"]
    results = _ragged_batch(server, module, "ragged_onnx", names)
    for result, n in zip(results, (2, 3, 1), strict=True):
        # The batch is the three requests in their arrival order; whichever order that was,
        # the batch inputs describe it (the request's own row says which it was).
        counts = result["COUNT"][0]
        assert sorted(counts) == [1, 2, 3]
        assert result["FLAT"] == [[c for c in counts for _ in range(int(c))]]
        assert result["ACC"] == [np.cumsum(counts).astype(int).tolist()]
        assert result["ACC0"] == [[0, *np.cumsum(counts).tolist()]]
        assert result["MAX"] == [[0.0, 0.0, 0.0]]  # shape [3]: the largest element count
        assert result["ITEM"] == [[n]]  # the request's own item shape (without the batch)
        assert result["FLAT_ITEMS"] == [counts]


@pytest.mark.parametrize("module", MODULES, ids=IDS)
def test_a_batch_output_is_cut_back_into_each_requests_shape(
    server: ServerProcess, module: Any
) -> None:
    def executions() -> int:
        stats = httpclient.InferenceServerClient(server.http_url).get_inference_statistics(
            "ragged_io"
        )
        return int(stats["model_stats"][0]["execution_count"])

    before = executions()
    results = _ragged_batch(server, module, "ragged_io", ["OUTPUT0"], name="INPUT0")
    assert [r["OUTPUT0"] for r in results] == [[[2.0, 2.0]], [[3.0, 3.0, 3.0]], [[1.0]]]
    assert executions() - before == 1  # one batch of the three shapes


@pytest.mark.parametrize("module", MODULES, ids=IDS)
def test_a_python_model_gets_each_ragged_request_on_its_own(
    server: ServerProcess, module: Any
) -> None:
    results = _ragged_batch(server, module, "ragged_python", ["OUTPUT", "REQUESTS"])
    assert [r["OUTPUT"] for r in results] == [[[4.0, 4.0]], [[6.0, 6.0, 6.0]], [[2.0]]]
    assert [r["REQUESTS"] for r in results] == [[[3]]] * 3  # one execute() of three requests


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
