"""The test model repository, built with onnx.helper at test time."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

from configs.generate import (
    IR_VERSION,
    OPSET,
    SIMPLE_CONFIG,
    identity_model,
    matmul_chain_model,
    save,
    simple_model,
)

# Triton datatype -> ONNX element type, for the identity models of every datatype.
ONNX_TYPES = {
    "BOOL": TensorProto.BOOL,
    "UINT8": TensorProto.UINT8,
    "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32,
    "UINT64": TensorProto.UINT64,
    "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16,
    "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16,
    "FP32": TensorProto.FLOAT,
    "FP64": TensorProto.DOUBLE,
    "BYTES": TensorProto.STRING,
}
CONFIG_TYPES = {k: "TYPE_STRING" if k == "BYTES" else f"TYPE_{k}" for k in ONNX_TYPES}


def identity_name(datatype: str) -> str:
    return f"identity_{datatype.lower()}"


def _write(root: Path, name: str, config: str | None, versions: dict[int, bytes]) -> None:
    for version, data in versions.items():
        path = root / name / str(version) / "model.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    if config is not None:
        (root / name / "config.pbtxt").write_text(config)


def build(root: Path) -> Path:
    """Every model the integration tests use."""
    save(simple_model(), root / "simple" / "1" / "model.onnx")
    (root / "simple" / "config.pbtxt").write_text(SIMPLE_CONFIG)

    # The same graph with a long batching window, so concurrent requests share executions.
    save(simple_model(), root / "simple_batching" / "1" / "model.onnx")
    (root / "simple_batching" / "config.pbtxt").write_text(
        SIMPLE_CONFIG.replace('"simple"', '"simple_batching"')
        + "dynamic_batching { max_queue_delay_microseconds: 300000 }\n"
    )

    for datatype, onnx_type in ONNX_TYPES.items():
        name = identity_name(datatype)
        save(identity_model(onnx_type, ["batch", "n"]), root / name / "1" / "model.onnx")
        (root / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
            f'input [ {{ name: "INPUT0", data_type: {CONFIG_TYPES[datatype]}, dims: [ -1 ] }} ]\n'
            f'output [ {{ name: "OUTPUT0", data_type: {CONFIG_TYPES[datatype]}, dims: [ -1 ] }} ]\n'
        )

    # No config.pbtxt: everything comes from auto-complete.
    save(identity_model(TensorProto.FLOAT, ["batch", 4]), root / "auto_fp32" / "1" / "model.onnx")
    # No batch dimension in the model: auto-complete must leave max_batch_size at 0.
    save(identity_model(TensorProto.FLOAT, [2, 3]), root / "auto_nobatch" / "1" / "model.onnx")

    # Versions 1..3 whose OUTPUT0 is INPUT0 + version, under three policies.
    for name, policy in (
        ("versioned_latest", ""),
        ("versioned_all", "version_policy: { all { } }\n"),
        ("versioned_specific", "version_policy: { specific { versions: [1, 3] } }\n"),
    ):
        for version in (1, 2, 3):
            save(_add_constant_model(version), root / name / str(version) / "model.onnx")
        (root / name / "config.pbtxt").write_text(
            f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 4\n{policy}'
        )

    # Config dims [16] seen by clients, [4, 4] by the model.
    save(identity_model(TensorProto.FLOAT, ["batch", 4, 4]), root / "reshaped" / "1" / "model.onnx")
    (root / "reshaped" / "config.pbtxt").write_text(
        'name: "reshaped"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 4\n'
        'input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 16 ],\n'
        "  reshape: { shape: [ 4, 4 ] } } ]\n"
        'output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 16 ],\n'
        "  reshape: { shape: [ 4, 4 ] } } ]\n"
    )

    # Classification with labels.
    save(identity_model(TensorProto.FLOAT, ["batch", 5]), root / "classifier" / "1" / "model.onnx")
    (root / "classifier" / "labels.txt").write_text("cat\ndog\nbird\nfish\nfrog\n")
    (root / "classifier" / "config.pbtxt").write_text(
        'name: "classifier"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 4\n'
        'input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 5 ] } ]\n'
        'output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 5 ], '
        'label_filename: "labels.txt" } ]\n'
    )

    # A model slow enough (tens of ms) for queues to build up under concurrent load.
    save(slow_model(), root / "slow_queue" / "1" / "model.onnx")
    (root / "slow_queue" / "config.pbtxt").write_text(
        SLOW_CONFIG.format(name="slow_queue", queue="default_queue_policy { max_queue_size: 2 }")
    )
    save(slow_model(), root / "slow" / "1" / "model.onnx")
    (root / "slow" / "config.pbtxt").write_text(SLOW_CONFIG.format(name="slow", queue=""))
    save(slow_model(), root / "slow_timeout" / "1" / "model.onnx")
    (root / "slow_timeout" / "config.pbtxt").write_text(
        SLOW_CONFIG.format(
            name="slow_timeout",
            queue="default_queue_policy { default_timeout_microseconds: 5000, "
            "allow_timeout_override: true }",
        )
    )

    save(simple_model(), root / "cached" / "1" / "model.onnx")
    (root / "cached" / "config.pbtxt").write_text(
        SIMPLE_CONFIG.replace('"simple"', '"cached"') + "response_cache { enable: true }\n"
    )

    # An ensemble with two parallel steps feeding a third, and two broken ensembles.
    save(simple_model(TensorProto.FLOAT, 4), root / "add_sub_fp32" / "1" / "model.onnx")
    (root / "add_sub_fp32" / "config.pbtxt").write_text(
        SIMPLE_CONFIG.replace('"simple"', '"add_sub_fp32"')
        .replace("TYPE_INT32", "TYPE_FP32")
        .replace("[ 16 ]", "[ 4 ]")
    )
    for name, text in (
        ("ensemble_parallel", ENSEMBLE_CONFIG),
        ("ensemble_missing_model", ENSEMBLE_CONFIG.replace('"add_sub_fp32"', '"no_such_model"')),
        ("ensemble_bad_wiring", ENSEMBLE_CONFIG.replace('value: "B"', 'value: "NOWHERE"', 1)),
    ):
        (root / name / "1").mkdir(parents=True, exist_ok=True)
        (root / name / "config.pbtxt").write_text(text.replace('"ensemble_parallel"', f'"{name}"'))

    # Stateful: a running sum per sequence, kept in implicit state.
    save(running_sum_model(), root / "running_sum" / "1" / "model.onnx")
    (root / "running_sum" / "config.pbtxt").write_text(
        RUNNING_SUM_CONFIG.format(name="running_sum", idle_us=5_000_000, corrid=CORRID_CONTROL)
    )
    save(running_sum_model(with_corrid=False), root / "running_sum_short" / "1" / "model.onnx")
    (root / "running_sum_short" / "config.pbtxt").write_text(
        RUNNING_SUM_CONFIG.format(name="running_sum_short", idle_us=200_000, corrid="").replace(
            ',\n  { name: "CORR", data_type: TYPE_INT64, dims: [ 1 ] }', ""
        )
    )

    # Two instance groups, one asking for a GPU (this machine has none: it runs on CPU), with
    # rate limiter resources.
    save(simple_model(), root / "multi_group" / "1" / "model.onnx")
    (root / "multi_group" / "config.pbtxt").write_text(
        SIMPLE_CONFIG.replace('"simple"', '"multi_group"') + "instance_group [\n"
        '  { name: "cpus", count: 2, kind: KIND_CPU,\n'
        '    rate_limiter { resources [ { name: "R", count: 1 } ] priority: 1 } },\n'
        '  { name: "gpus", count: 1, kind: KIND_GPU, gpus: [ 0 ] }\n'
        "]\n"
    )

    # Python models (model.py), each with a helper module of its own folder where useful.
    for name, source, config in PYTHON_MODELS:
        (root / name / "1").mkdir(parents=True, exist_ok=True)
        (root / name / "1" / "model.py").write_text(source)
        (root / name / "config.pbtxt").write_text(config.replace("{name}", name))
    # No config.pbtxt: the model's own auto_complete_config describes it.
    (root / "py_auto" / "1").mkdir(parents=True, exist_ok=True)
    (root / "py_auto" / "1" / "model.py").write_text(PY_AUTO)
    (root / "ensemble_mixed" / "1").mkdir(parents=True, exist_ok=True)
    (root / "ensemble_mixed" / "config.pbtxt").write_text(ENSEMBLE_MIXED_CONFIG)
    (root / "py_add_sub" / "1" / "arith.py").write_text(
        "def add_sub(a, b):\n    return a + b, a - b\n"
    )

    # Warm-up samples of each kind; one whose data file is missing must fail its load.
    save(simple_model(), root / "warmed" / "1" / "model.onnx")
    (root / "warmed" / "warmup").mkdir(parents=True, exist_ok=True)
    (root / "warmed" / "warmup" / "ones.bin").write_bytes(b"\x01\x00\x00\x00" * 16)
    (root / "warmed" / "config.pbtxt").write_text(
        SIMPLE_CONFIG.replace('"simple"', '"warmed"') + WARMUP.format(file="ones.bin")
    )
    save(simple_model(), root / "warmup_missing_file" / "1" / "model.onnx")
    (root / "warmup_missing_file" / "config.pbtxt").write_text(
        SIMPLE_CONFIG.replace('"simple"', '"warmup_missing_file"')
        + WARMUP.format(file="absent.bin")
    )

    # Broken models: the server must report them and serve the rest.
    _write(root, "broken_model_file", None, {1: b"this is not an onnx file"})
    save(simple_model(), root / "broken_config" / "1" / "model.onnx")
    (root / "broken_config" / "config.pbtxt").write_text(
        'name: "broken_config"\nmax_batch_size: [\n'
    )
    save(simple_model(), root / "wrong_dims" / "1" / "model.onnx")
    (root / "wrong_dims" / "config.pbtxt").write_text(
        SIMPLE_CONFIG.replace('"simple"', '"wrong_dims"').replace(
            'dims: [ 16 ] },\n  { name: "INPUT1"', 'dims: [ 8 ] },\n  { name: "INPUT1"'
        )
    )
    return root


PY_SIMPLE_CONFIG = SIMPLE_CONFIG.replace(
    'platform: "onnxruntime_onnx"', 'backend: "python"'
).replace('"simple"', '"{name}"')
PY_FP32_CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: 4
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]
"""

PY_ADD_SUB = """\
import json

import numpy as np
import triton_python_backend_utils as pb_utils
from arith import add_sub


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        out = pb_utils.get_output_config_by_name(config, "OUTPUT0")
        self.dtype = pb_utils.triton_string_to_numpy(out["data_type"])
        self.name = args["model_name"]

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            total, difference = add_sub(a, b)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", total.astype(self.dtype)),
                pb_utils.Tensor("OUTPUT1", difference.astype(self.dtype)),
            ]))
        return responses

    def finalize(self):
        pass
"""

PY_BLS = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            # conditional pipeline: positive inputs go to version 1 (+1), others to version 2
            version = 1 if x.sum() > 0 else 2
            call = pb_utils.InferenceRequest(
                model_name="versioned_all", model_version=version,
                requested_output_names=["OUTPUT0"], inputs=[pb_utils.Tensor("INPUT0", x)])
            result = call.exec()
            if result.has_error():
                raise pb_utils.TritonModelException(result.error().message())
            y = pb_utils.get_output_tensor_by_name(result, "OUTPUT0").as_numpy()
            # loop pipeline: keep adding through the ONNX model until the first value >= 10
            while y[0, 0] < 10:
                again = pb_utils.InferenceRequest(
                    model_name="versioned_all", model_version=3,
                    requested_output_names=["OUTPUT0"], inputs=[pb_utils.Tensor("INPUT0", y)])
                y = pb_utils.get_output_tensor_by_name(again.exec(), "OUTPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", y)]))
        return responses
"""

PY_BLS_MISSING = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            call = pb_utils.InferenceRequest(
                model_name="no_such_model", requested_output_names=["Y"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "INPUT0")])
            result = call.exec()
            out.append(pb_utils.InferenceResponse(error=result.error()))
        return out
"""

PY_RAISE = """\
class TritonPythonModel:
    def execute(self, requests):
        raise ValueError("this model always fails")
"""

PY_CRASH = """\
import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if (x == 13).any():
                os._exit(3)  # a crash: the process dies mid-request
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses
"""

PY_BUSY = """\
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            deadline = time.perf_counter() + 0.05
            while time.perf_counter() < deadline:  # 50 ms of pure-Python CPU work
                pass
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses
"""

PY_REPEAT = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            count = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().ravel()[0])
            for i in range(count):
                sender.send(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", np.array([i], dtype=np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

PY_REPEAT_CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] } ]
"""

PY_WAIT_CANCEL = """\
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if requests[0].is_cancelled():
                pb_utils.Logger.log_info("request cancelled: stopping early")
                return [pb_utils.InferenceResponse(error=pb_utils.TritonError("cancelled"))]
            time.sleep(0.01)
        x = pb_utils.get_input_tensor_by_name(requests[0], "INPUT0")
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x.as_numpy())])]
"""

PY_AUTO = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input(
            {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [3]})
        auto_complete_model_config.add_output(
            {"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [3]})
        auto_complete_model_config.set_max_batch_size(4)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() * 2)])
            for r in requests]
"""

# A decoupled Python model: IN = [count, size] -> `count` responses, each OUT of `size` bytes and
# SENT, the time it was sent (CLOCK_MONOTONIC, one clock for every process of the machine).
PY_FLOOD = """\
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            count, size = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().tolist()
            block = np.ones(size, dtype=np.uint8)
            for _ in range(count):
                stamp = np.array([time.monotonic_ns()], dtype=np.int64)
                sender.send(
                    pb_utils.InferenceResponse(
                        [pb_utils.Tensor("OUT", block), pb_utils.Tensor("SENT", stamp)]
                    )
                )
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
PY_FLOOD_CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [ {{ name: "IN", data_type: TYPE_INT64, dims: [ 2 ] }} ]
output [
  {{ name: "OUT", data_type: TYPE_UINT8, dims: [ -1 ] }},
  {{ name: "SENT", data_type: TYPE_INT64, dims: [ 1 ] }}
]
"""


def write_py_flood(root: Path, name: str) -> None:
    """PY_FLOOD as model `name` in the repository at `root`."""
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(PY_FLOOD)
    (root / name / "config.pbtxt").write_text(PY_FLOOD_CONFIG.format(name=name))


PY_HANG = PY_CRASH.replace(
    "os._exit(3)  # a crash: the process dies mid-request", "time.sleep(3600)  # a hang"
).replace("import os", "import time")

PYTHON_MODELS = (
    (
        "py_hang",
        PY_HANG,
        PY_FP32_CONFIG + 'parameters { key: "execute_timeout_s" value: { string_value: "1" } }\n',
    ),
    ("py_wait_cancel", PY_WAIT_CANCEL, PY_FP32_CONFIG),
    ("py_repeat", PY_REPEAT, PY_REPEAT_CONFIG),
    ("py_add_sub", PY_ADD_SUB, PY_SIMPLE_CONFIG),
    ("py_bls", PY_BLS, PY_FP32_CONFIG),
    ("py_bls_missing", PY_BLS_MISSING, PY_FP32_CONFIG),
    ("py_raise", PY_RAISE, PY_FP32_CONFIG),
    ("py_crash", PY_CRASH, PY_FP32_CONFIG),
    ("py_busy", PY_BUSY, PY_FP32_CONFIG),
)

# ONNX `simple` doubles IN, then the Python model adds IN again: OUT = 3 * IN.
ENSEMBLE_MIXED_CONFIG = """\
name: "ensemble_mixed"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN", data_type: TYPE_INT32, dims: [ 16 ] } ]
output [ { name: "OUT", data_type: TYPE_INT32, dims: [ 16 ] } ]
ensemble_scheduling { step [
  { model_name: "simple", model_version: -1,
    input_map { key: "INPUT0" value: "IN" } input_map { key: "INPUT1" value: "IN" }
    output_map { key: "OUTPUT0" value: "DOUBLE" } },
  { model_name: "py_add_sub", model_version: -1,
    input_map { key: "INPUT0" value: "DOUBLE" } input_map { key: "INPUT1" value: "IN" }
    output_map { key: "OUTPUT0" value: "OUT" } }
] }
"""

ENSEMBLE_CONFIG = """\
name: "ensemble_parallel"
platform: "ensemble"
max_batch_size: 4
input [ { name: "IN", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [
  { name: "SUM", data_type: TYPE_FP32, dims: [ 4 ] },
  { name: "DIFF", data_type: TYPE_FP32, dims: [ 4 ] }
]
ensemble_scheduling { step [
  { model_name: "versioned_all", model_version: 1,
    input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "A" } },
  { model_name: "versioned_all", model_version: 2,
    input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "B" } },
  { model_name: "add_sub_fp32", model_version: -1,
    input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }
    output_map { key: "OUTPUT0" value: "SUM" } output_map { key: "OUTPUT1" value: "DIFF" } }
] }
"""

CORRID_CONTROL = """,
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_INT64 } ] }"""

RUNNING_SUM_CONFIG = """\
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ {{ name: "INPUT", data_type: TYPE_INT32, dims: [ 1 ] }} ]
output [
  {{ name: "OUTPUT", data_type: TYPE_INT32, dims: [ 1 ] }},
  {{ name: "CORR", data_type: TYPE_INT64, dims: [ 1 ] }}
]
sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "READY"
       control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }}{corrid}
  ]
  state [ {{ input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
}}
"""


def running_sum_model(with_corrid: bool = True) -> onnx.ModelProto:
    """OUTPUT = (START ? 0 : STATE_IN) + INPUT * READY; STATE_OUT = OUTPUT; CORR = CORRID."""

    def info(name: str, elem: int = TensorProto.INT32) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, elem, ["batch", 1])

    nodes = [
        helper.make_node("Sub", ["one", "START"], ["keep"]),
        helper.make_node("Mul", ["STATE_IN", "keep"], ["previous"]),
        helper.make_node("Mul", ["INPUT", "READY"], ["ready_input"]),
        helper.make_node("Add", ["previous", "ready_input"], ["OUTPUT"]),
        helper.make_node("Identity", ["OUTPUT"], ["STATE_OUT"]),
    ]
    inputs = [info("INPUT"), info("START"), info("READY"), info("STATE_IN")]
    outputs = [info("OUTPUT"), info("STATE_OUT")]
    if with_corrid:
        nodes.append(helper.make_node("Identity", ["CORRID"], ["CORR"]))
        inputs.append(info("CORRID", TensorProto.INT64))
        outputs.append(info("CORR", TensorProto.INT64))
    graph = helper.make_graph(
        nodes,
        "running_sum",
        inputs,
        outputs,
        initializer=[helper.make_tensor("one", TensorProto.INT32, [1], [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    return model


WARMUP = """\
model_warmup [
  {{ name: "zeros", batch_size: 8, count: 2, inputs {{
      key: "INPUT0" value: {{ data_type: TYPE_INT32, dims: [ 16 ], zero_data: true }} }}
    inputs {{ key: "INPUT1" value: {{ data_type: TYPE_INT32, dims: [ 16 ], random_data: true }} }}
  }},
  {{ name: "from_file", batch_size: 1, inputs {{
      key: "INPUT0" value: {{ data_type: TYPE_INT32, dims: [ 16 ], input_data_file: "{file}" }} }}
    inputs {{ key: "INPUT1" value: {{ data_type: TYPE_INT32, dims: [ 16 ], zero_data: true }} }}
  }}
]
"""

SLOW_CONFIG = """\
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 1
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1024 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1024 ] }} ]
dynamic_batching {{ priority_levels: 2 default_priority_level: 2 {queue} }}
"""


def slow_model(steps: int = 160) -> onnx.ModelProto:
    """OUTPUT0 = tanh(... tanh(INPUT0 @ W) ... @ W): a chain of 1024x1024 MatMuls."""
    return matmul_chain_model(1024, steps, "batch")


def _add_constant_model(value: int) -> onnx.ModelProto:
    """OUTPUT0 = INPUT0 + value (FP32, [batch, 4])."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "c"], ["OUTPUT0"])],
        "add_constant",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 4])],
        initializer=[helper.make_tensor("c", TensorProto.FLOAT, [1], [float(value)])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    return model


def write_sized_model(root: Path, name: str, mib: float, value: float, extra: str = "") -> Path:
    """A model of about `mib` MiB: OUTPUT0 = W[INDEX], W a constant FP32 vector of `value`s
    (an input-dependent Gather keeps W in ONNX Runtime's memory; no constant folding drops it).
    `extra`: more lines for its config.pbtxt (e.g. parameters, a sequence batcher)."""
    import numpy as np
    from onnx import numpy_helper

    weight = numpy_helper.from_array(
        np.full(max(1, int(mib * 2**20) // 4), value, dtype=np.float32), "W"
    )
    graph = helper.make_graph(
        [helper.make_node("Gather", ["W", "INDEX"], ["OUTPUT0"])],
        name,
        [helper.make_tensor_value_info("INDEX", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [1])],
        initializer=[weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    folder = root / name
    save(model, folder / "1" / "model.onnx")
    (folder / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 0\n'
        'input [ { name: "INDEX", data_type: TYPE_INT64, dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]\n' + extra
    )
    return folder
