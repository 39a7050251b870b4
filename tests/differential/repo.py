"""The differential suite's model repository: Python models only (the reference's wheel carries
the Python backend alone), the same files served by both servers."""

from __future__ import annotations

import textwrap
from pathlib import Path

_ADD_SUB = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            if float(a.flatten()[0]) == -999.0:
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("add_sub refuses -999")))
                continue
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", (a + b).astype(np.float32)),
                pb_utils.Tensor("OUTPUT1", (a - b).astype(np.float32)),
            ]))
        return responses
"""

_IDENTITY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]) for r in requests]
"""

_REPEAT = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            for value in values.flatten():
                sender.send(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", np.array([value], dtype=np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

_ACCUMULATE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.totals = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            key = request.correlation_id()
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if request.flags() & 1:
                self.totals[key] = 0
            self.totals[key] = self.totals.get(key, 0) + int(value.sum())
            total = self.totals[key]
            if request.flags() & 2:
                self.totals.pop(key, None)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", np.array([[total]], dtype=np.int32))]))
        return responses
"""

_RAISES = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        raise pb_utils.TritonModelException("raises always")
"""

_SOURCE = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(
            [pb_utils.Tensor("OUT", np.array([7], dtype=np.int32))]) for _ in requests]
"""

_CONFIGS: dict[str, str | None] = {
    "add_sub": """
        backend: "python"
        max_batch_size: 8
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
                { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
                 { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
        dynamic_batching { }
        instance_group [ { count: 1 kind: KIND_CPU } ]
    """,
    "identity_bytes": """
        backend: "python"
        max_batch_size: 0
        input [ { name: "IN" data_type: TYPE_STRING dims: [ -1 ] } ]
        output [ { name: "OUT" data_type: TYPE_STRING dims: [ -1 ] } ]
        instance_group [ { count: 1 kind: KIND_CPU } ]
    """,
    "identity_int32": """
        backend: "python"
        max_batch_size: 0
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
        instance_group [ { count: 1 kind: KIND_CPU } ]
    """,
    "repeat": """
        backend: "python"
        max_batch_size: 0
        model_transaction_policy { decoupled: true }
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
        instance_group [ { count: 1 kind: KIND_CPU } ]
    """,
    "accumulate": """
        backend: "python"
        max_batch_size: 1
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
        sequence_batching { max_sequence_idle_microseconds: 60000000 }
        instance_group [ { count: 1 kind: KIND_CPU } ]
    """,
    "raises": """
        backend: "python"
        max_batch_size: 0
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
        instance_group [ { count: 1 kind: KIND_CPU } ]
    """,
    "pipeline": """
        platform: "ensemble"
        max_batch_size: 8
        input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] },
                { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] } ]
        ensemble_scheduling { step [ {
          model_name: "add_sub" model_version: -1
          input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }
          output_map { key: "OUTPUT0" value: "SUM" } } ] }
    """,
    # Models that take no inputs: outputs only, the same batching (a request has no batch size),
    # and a model folder with only its model.py (no config.pbtxt, no auto_complete_config).
    "source": """
        backend: "python"
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
    """,
    "source_batched": """
        backend: "python"
        max_batch_size: 4
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
    """,
    "bare": None,
}

_SOURCES = {
    "add_sub": _ADD_SUB,
    "identity_bytes": _IDENTITY,
    "identity_int32": _IDENTITY,
    "repeat": _REPEAT,
    "accumulate": _ACCUMULATE,
    "raises": _RAISES,
    "source": _SOURCE,
    "source_batched": _SOURCE,
    "bare": _SOURCE,
}

MODELS = tuple(_CONFIGS)


def source(name: str) -> str:
    """The model.py of one of the models."""
    return _SOURCES[name].lstrip()


def build(root: Path, names: tuple[str, ...] = MODELS) -> Path:
    """Write the models `names` under `root` (version 1 each) and return `root`."""
    for name in names:
        folder = root / name
        (folder / "1").mkdir(parents=True, exist_ok=True)
        text = _CONFIGS[name]
        if text is not None:
            config = f'name: "{name}"\n' + textwrap.dedent(text).strip() + "\n"
            (folder / "config.pbtxt").write_text(config)
        if name in _SOURCES:
            (folder / "1" / "model.py").write_text(_SOURCES[name].lstrip())
    return root
