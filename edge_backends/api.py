"""The backend contract: what a backend is given, and what it must provide.

A backend turns a model file into runnable *instances*. It sees numpy arrays, tensor names and
plain settings; it never sees a request object, a protocol, a status code or JSON.

Example, the smallest backend::

    class EchoBackend:
        name = "echo"

        def inspect(self, model_path: Path) -> ModelSignature:
            return ModelSignature(inputs=(TensorSpec("x", "FP32", (-1,)),),
                                  outputs=(TensorSpec("y", "FP32", (-1,)),))

        def create_instance(self, spec: InstanceSpec) -> ModelInstance:
            return EchoInstance()

    class EchoInstance:
        def execute(self, inputs, output_names):
            return {"y": inputs["x"]}

        def close(self) -> None:
            pass
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

Arrays = Mapping[str, np.ndarray[Any, Any]]


class BackendError(Exception):
    """Base of errors raised by backends; the message is shown to users as it is."""


class ModelLoadError(BackendError):
    """The model file cannot be loaded (missing, corrupt, unsupported)."""


class ExecutionError(BackendError):
    """The model failed while running a batch."""


class InputRejected(BackendError):
    """An input's contents cannot be given to this backend (e.g. non-UTF-8 text for ONNX
    strings): the request is at fault, not the model. A batch that fails with it is re-run
    request by request, so only the offending request fails."""


@dataclass(frozen=True)
class TensorSpec:
    """A tensor as the model file declares it: -1 marks a dynamic dimension."""

    name: str
    datatype: str  # Triton name, e.g. "FP32"
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ModelSignature:
    """What a model file says about itself; used to auto-complete and validate config.pbtxt."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


@dataclass(frozen=True)
class InstanceSpec:
    """Everything a backend needs to create one model instance."""

    model_name: str
    model_version: int
    model_path: Path
    instance_name: str
    kind: str = "KIND_CPU"  # KIND_CPU | KIND_GPU | KIND_AUTO
    device_id: int = 0
    # Config `parameters` (string values), named as Triton's backend for this format names them.
    parameters: Mapping[str, str] = field(default_factory=dict)
    # The graph optimisation level from `optimization { graph { level } }`, None when unset.
    graph_optimization_level: int | None = None
    # How many instances of this model run at once; backends size their thread pools with it.
    instance_count: int = 1
    # The model's configuration as JSON-ready data (Python models receive it in `args`).
    model_config: Mapping[str, Any] | None = None
    # The instance group's `profile` list (TensorRT optimization profiles; empty: all).
    profiles: tuple[str, ...] = ()
    # `optimization { execution_accelerators { gpu_execution_accelerator [...] } }`:
    # (name, parameters) pairs in the config's order, e.g. ("tensorrt", {"precision_mode": "FP16"}).
    gpu_accelerators: tuple[tuple[str, Mapping[str, str]], ...] = ()
    # A folder this model version may keep derived files in (built engines, converted models),
    # under the server's state directory; None when the server has none.
    cache_dir: Path | None = None
    # The server's inference entry for models that call other models (BLS):
    # (model, version, inputs by name, output names) -> outputs by name. Blocking.
    host: Any = None


class ModelInstance(Protocol):
    """One loaded copy of a model; `execute` is called from one worker thread at a time.

    An instance may also have `placement_kind` ("KIND_CPU" / "KIND_GPU": where it really runs)
    and `placement_note` (why that differs from its spec, e.g. the GPU ran out of memory at
    load); the server reports both."""

    def execute(
        self, inputs: Arrays, output_names: Sequence[str]
    ) -> dict[str, np.ndarray[Any, Any]]:
        """Run one batch: inputs by name, return the named outputs."""
        ...

    def close(self) -> None:
        """Release the instance's resources."""
        ...


class Backend(Protocol):
    """A model format's loader."""

    name: str

    def inspect(self, model_path: Path) -> ModelSignature:
        """Read the model file's inputs and outputs without serving it."""
        ...

    def create_instance(self, spec: InstanceSpec) -> ModelInstance:
        """Load one instance; raise ModelLoadError with the reason on failure."""
        ...
