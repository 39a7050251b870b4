"""What a TensorRT engine says about itself, and the decisions made from it.

Kept apart from `trt.py` (which needs tensorrt and a GPU) so that every decision can be tested
anywhere from a recorded description: config auto-complete, the choice of optimization profile
for a batch, the datatype table, and the wording of load errors.

A description is plain data; `describe_engine` in trt.py records one from a live engine, and
`EngineDescription.to_json()` / `from_json()` store it (the device check script records real
engines this way).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from edge_backends.api import ModelLoadError, ModelSignature, TensorSpec

# tensorrt.DataType member name -> Triton datatype. TensorRT's FP8, INT4 and FP4 have no
# Triton counterpart: engines with such I/O tensors are refused at load.
TRT_TO_TRITON: dict[str, str] = {
    "FLOAT": "FP32",
    "HALF": "FP16",
    "INT8": "INT8",
    "INT32": "INT32",
    "INT64": "INT64",
    "BOOL": "BOOL",
    "UINT8": "UINT8",
}

Shape = tuple[int, ...]


@dataclass(frozen=True)
class ProfileRange:
    """One input's shape range in one optimization profile."""

    min: Shape
    opt: Shape
    max: Shape


@dataclass(frozen=True)
class EngineTensor:
    name: str
    is_input: bool
    datatype: str  # Triton datatype
    shape: Shape  # -1 for dynamic dimensions
    # Inputs only: the range allowed by each optimization profile, by profile index.
    profiles: tuple[ProfileRange, ...] = ()


@dataclass(frozen=True)
class EngineDescription:
    tensors: tuple[EngineTensor, ...]
    num_profiles: int = 1
    trt_version: str = ""
    device_name: str = ""

    @property
    def inputs(self) -> tuple[EngineTensor, ...]:
        return tuple(t for t in self.tensors if t.is_input)

    @property
    def outputs(self) -> tuple[EngineTensor, ...]:
        return tuple(t for t in self.tensors if not t.is_input)

    def to_json(self) -> dict[str, Any]:
        return {
            "trt_version": self.trt_version,
            "device_name": self.device_name,
            "num_profiles": self.num_profiles,
            "tensors": [
                {
                    "name": t.name,
                    "is_input": t.is_input,
                    "datatype": t.datatype,
                    "shape": list(t.shape),
                    "profiles": [[list(p.min), list(p.opt), list(p.max)] for p in t.profiles],
                }
                for t in self.tensors
            ],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EngineDescription:
        return cls(
            tensors=tuple(
                EngineTensor(
                    name=t["name"],
                    is_input=bool(t["is_input"]),
                    datatype=t["datatype"],
                    shape=tuple(t["shape"]),
                    profiles=tuple(
                        ProfileRange(tuple(lo), tuple(opt), tuple(hi))
                        for lo, opt, hi in t.get("profiles", [])
                    ),
                )
                for t in data["tensors"]
            ),
            num_profiles=int(data.get("num_profiles", 1)),
            trt_version=str(data.get("trt_version", "")),
            device_name=str(data.get("device_name", "")),
        )


@dataclass
class BatchingShape:
    """Whether the engine's first dimension is a batch dimension, and its limit."""

    batching: bool
    max_batch_size: int = 0
    reasons: list[str] = field(default_factory=list)


def batching_shape(engine: EngineDescription) -> BatchingShape:
    """Whether the model batches, and its largest batch: every input and output must have a
    dynamic first dimension, and the largest batch is the largest N such that every batch size
    from 1 to N fits some optimization profile (the batcher may form any of them)."""
    why = [
        f"'{t.name}' has a fixed first dimension"
        for t in engine.tensors
        if not t.shape or t.shape[0] != -1
    ]
    if why:
        return BatchingShape(False, 0, why)
    ranges = []  # per profile: the batch sizes every input accepts
    for index in range(engine.num_profiles):
        bounds = [t.profiles[index] for t in engine.inputs if index < len(t.profiles)]
        if bounds:
            ranges.append((max(b.min[0] for b in bounds), min(b.max[0] for b in bounds)))
    covered = 0
    for low, high in sorted(ranges):
        if low > covered + 1:
            break
        covered = max(covered, high)
    if covered < 1:
        return BatchingShape(False, 0, ["no optimization profile accepts a batch of 1"])
    return BatchingShape(True, covered)


def signature(engine: EngineDescription) -> ModelSignature:
    return ModelSignature(
        inputs=tuple(TensorSpec(t.name, t.datatype, t.shape) for t in engine.inputs),
        outputs=tuple(TensorSpec(t.name, t.datatype, t.shape) for t in engine.outputs),
    )


def auto_complete(engine: EngineDescription, config: dict[str, Any]) -> dict[str, Any]:
    """Set max_batch_size of a JSON config (proto field names) from the engine, as Triton's
    TensorRT backend does, and check a max_batch_size the config sets against the engine.
    Inputs and outputs are then filled from `signature(engine)` like any described model."""
    batch = batching_shape(engine)
    wanted = int(config.get("max_batch_size") or 0)
    if wanted > 0 and not batch.batching:
        raise ModelLoadError(
            f"config.pbtxt sets max_batch_size {wanted} but the engine cannot batch: "
            + "; ".join(batch.reasons)
        )
    if wanted > batch.max_batch_size > 0:
        raise ModelLoadError(
            f"config.pbtxt sets max_batch_size {wanted} but the engine's optimization profiles "
            f"allow at most {batch.max_batch_size}"
        )
    fully_auto = not config.get("input") and not config.get("output")
    if fully_auto and wanted == 0 and batch.batching:
        config["max_batch_size"] = batch.max_batch_size
        if not config.get("sequence_batching") and not config.get("dynamic_batching"):
            config["dynamic_batching"] = {}
    return config


def select_profile(
    engine: EngineDescription, shapes: Mapping[str, Shape], allowed: Sequence[int] = ()
) -> int:
    """The first allowed profile whose ranges hold every input shape of this batch.

    `allowed` comes from the instance group's `profile` list (Triton: empty means all)."""
    candidates = list(allowed) or list(range(engine.num_profiles))
    problems = []
    for index in candidates:
        misfit = _misfit(engine, shapes, index)
        if misfit is None:
            return index
        problems.append(f"profile {index}: {misfit}")
    raise ModelLoadError(
        "no optimization profile accepts these input shapes ("
        + ", ".join(f"{name} {list(shape)}" for name, shape in shapes.items())
        + "): "
        + "; ".join(problems)
    )


def _misfit(engine: EngineDescription, shapes: Mapping[str, Shape], index: int) -> str | None:
    for tensor in engine.inputs:
        shape = shapes.get(tensor.name)
        if shape is None:
            return f"input '{tensor.name}' is missing"
        if index >= len(tensor.profiles):  # a static input: its shape is fixed
            if tuple(shape) != tensor.shape:
                return f"'{tensor.name}' must be {list(tensor.shape)}"
            continue
        bounds = tensor.profiles[index]
        if len(shape) != len(bounds.min) or any(
            not lo <= d <= hi for d, lo, hi in zip(shape, bounds.min, bounds.max, strict=True)
        ):
            return f"'{tensor.name}' allows {list(bounds.min)} to {list(bounds.max)}"
    return None


def allowed_profiles(raw: Sequence[str], engine: EngineDescription) -> tuple[int, ...]:
    """The instance group's `profile` entries as indexes, checked against the engine."""
    chosen = []
    for item in raw:
        if not item.isdigit() or int(item) >= engine.num_profiles:
            raise ModelLoadError(
                f"instance group profile '{item}' does not exist: the engine has "
                f"{engine.num_profiles} optimization profile(s), 0 to {engine.num_profiles - 1}"
            )
        chosen.append(int(item))
    return tuple(chosen)


# What TensorRT logs when a plan cannot be deserialized here, and what to tell the user.
_LOAD_FAILURES = (
    (
        re.compile(r"(?i)version|serializ.*(magic|tag)|incompatible.*tensorrt"),
        "it was built with another TensorRT version; rebuild it on this device with this "
        "TensorRT ({trt})",
    ),
    (
        re.compile(r"(?i)(incompatible device|compute capability|different.*(gpu|device)|sm_)"),
        "it was built for another GPU; TensorRT engines run only on the GPU model they were "
        "built on: rebuild it on this device",
    ),
)


def explain_deserialize_failure(messages: Sequence[str], trt_version: str) -> str:
    """A load error from what TensorRT logged while refusing a plan."""
    text = " ".join(messages)
    for pattern, advice in _LOAD_FAILURES:
        if pattern.search(text):
            return (
                f"TensorRT cannot deserialize the engine: {advice.format(trt=trt_version)}"
                f" (TensorRT said: {text.strip()})"
            )
    said = f" (TensorRT said: {text.strip()})" if text.strip() else ""
    return f"TensorRT cannot deserialize the engine: the file is not a valid plan{said}"
