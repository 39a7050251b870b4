"""The models the ceiling servers answer for: the repository's config, and the least work that
produces a correct response (numpy for `simple`, raw ONNX Runtime for the ONNX models).

The ceilings (bench.ceiling_http, bench.ceiling_grpc) only do the protocol around these, so the
server's throughput divided by theirs is its own overhead on this machine.

`simple_compute="ort"` (the ceilings' `--simple-compute ort`) computes `simple` with ONNX Runtime
too, from the repository's simple/1/model.onnx, as the server does: a reference for how much of
the server's cost on `simple` is ONNX Runtime's own (its run releases and retakes the GIL, which
under load costs thread switches that numpy's ~1 us add/sub does not). The numpy ceilings stay the
ones issue 20's ratios are measured against.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from appliance.common.protojson import message_to_dict
from bench.raw import open_session
from edge_backends.datatypes import BY_CONFIG

Arrays = dict[str, np.ndarray]
SIMPLE_COMPUTES = ("numpy", "ort")  # how `simple` is computed; numpy is the default


class BadRequest(Exception):
    """Inputs the model cannot take (the ceilings answer 400 / INVALID_ARGUMENT)."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str  # wire name: "FP32"
    dtype: np.dtype[Any]
    shape: list[int]  # as the metadata gives it: -1 for the batch dimension

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": self.shape}


@dataclass(frozen=True)
class CeilingModel:
    """One model: its metadata and config (as the server writes them) and how to compute it."""

    name: str
    platform: str
    config: Any  # model_config_pb2.ModelConfig
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    compute: Instance
    computed_by: str  # "numpy" or "onnxruntime"

    @property
    def inference_count(self) -> int:
        return self.compute.count

    def metadata(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "versions": ["1"],
            "platform": self.platform,
            "inputs": [t.as_dict() for t in self.inputs.values()],
            "outputs": [t.as_dict() for t in self.outputs.values()],
        }

    def config_dict(self) -> dict[str, Any]:
        return message_to_dict(self.config)


def _specs(tensors: Any, batched: bool) -> dict[str, TensorSpec]:
    specs = {}
    for t in tensors:
        kind = BY_CONFIG[model_config_pb2.DataType.Name(t.data_type)]
        shape = ([-1] if batched else []) + [int(d) for d in t.dims]
        specs[t.name] = TensorSpec(t.name, kind.triton, kind.numpy, shape)
    return specs


def _add_sub(inputs: Arrays) -> Arrays:
    a, b = inputs["INPUT0"], inputs["INPUT1"]
    return {"OUTPUT0": a + b, "OUTPUT1": a - b}


def _ort_compute(model_file: Path) -> Callable[[Arrays], Arrays]:
    session = open_session(str(model_file))  # the same session options as bench.raw
    names = [o.name for o in session.get_outputs()]

    def compute(inputs: Arrays) -> Arrays:
        return dict(zip(names, session.run(names, inputs), strict=True))

    return compute


def _reshaped(compute: Callable[[Arrays], Arrays], config: Any) -> Callable[[Arrays], Arrays]:
    """Apply the config's `reshape`s: inputs from their dims to the model's shape, outputs back
    (the batch dimension, where the model has one, kept as it is)."""
    lead = 1 if config.max_batch_size > 0 else 0
    into = {t.name: tuple(t.reshape.shape) for t in config.input if t.HasField("reshape")}
    back = {t.name: tuple(t.dims) for t in config.output if t.HasField("reshape")}
    if not into and not back:
        return compute

    def run(inputs: Arrays) -> Arrays:
        for name, shape in into.items():
            inputs[name] = inputs[name].reshape(inputs[name].shape[:lead] + shape)
        outputs = compute(inputs)
        for name, shape in back.items():
            outputs[name] = outputs[name].reshape(outputs[name].shape[:lead] + shape)
        return outputs

    return run


class Instance:
    """The model's one instance: one execution at a time, counted.

    One at a time as the server's one instance per model: the synchronous gRPC ceiling's pool
    threads would otherwise time-slice eight ORT runs on one core (each request then takes eight
    runs' time; DenseNet at c=8 finished no request in a 1.3 s window). The count (inferences,
    batch elements included) is what the ceilings report as inference_count, so bench.run can
    divide the process's CPU by it as it does for the server."""

    def __init__(self, name: str, compute: Callable[[Arrays], Arrays], batched: bool) -> None:
        self.name = name
        self.count = 0
        self._compute = compute
        self._batched = batched
        self._lock = threading.Lock()

    def __call__(self, inputs: Arrays) -> Arrays:
        with self._lock:
            try:
                outputs = self._compute(inputs)
            except Exception as exc:  # ORT's own errors have no common base but Exception
                raise BadRequest(f"model '{self.name}': {exc}") from exc
            first = next(iter(inputs.values()), None)
            self.count += int(first.shape[0]) if self._batched and first is not None else 1
            return outputs


def load_model(repository: Path, name: str, simple_compute: str = "numpy") -> CeilingModel:
    """The model from the repository that configs.generate writes (config.pbtxt, 1/model.onnx),
    or bench.python_vs_triton's `add_sub` (numpy's add and subtract, as `simple`'s); `simple`
    computed with numpy, or with ONNX Runtime on its model.onnx when `simple_compute`
    is "ort" (the other models always with ONNX Runtime)."""
    if simple_compute not in SIMPLE_COMPUTES:
        raise ValueError(f"simple_compute must be one of {SIMPLE_COMPUTES}, not {simple_compute!r}")
    folder = repository / name
    config = text_format.Parse(
        (folder / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )
    batched = config.max_batch_size > 0
    inputs, outputs = _specs(config.input, batched), _specs(config.output, batched)
    # bench.python_vs_triton's add_sub (a Python model: no model.onnx) is always numpy's.
    by_numpy = (name == "simple" and simple_compute == "numpy") or name == "add_sub"
    compute: Callable[[Arrays], Arrays] = (
        _add_sub if by_numpy else _ort_compute(folder / "1" / "model.onnx")
    )
    platform = config.platform or config.backend
    instance = Instance(name, _reshaped(compute, config), batched)
    computed_by = "numpy" if by_numpy else "onnxruntime"
    return CeilingModel(name, platform, config, inputs, outputs, instance, computed_by)


def load_models(
    repository: Path, names: list[str], simple_compute: str = "numpy"
) -> dict[str, CeilingModel]:
    return {name: load_model(repository, name, simple_compute) for name in names}
