"""Triton's `identity` backend: each requested OUTPUT<n> is a copy of INPUT<n>.

Tritonserver ships it (`backend: "identity"`, no model file: the version folder may be empty)
and its own test suites, perf_analyzer's examples and many users' smoke tests build models on
it. The same rules as Triton's: the config lists as many inputs as outputs, named INPUT<n> and
OUTPUT<n>, each pair with the same datatype and dims; `parameters` `execute_delay_ms` (each
execution sleeps that long, times the instance's index when `instance_wise_delay_multiplier`
is set) and `creation_delay_sec` (each instance takes that long to load). A requested output
whose input is `optional` and left out of the request is zeros, as Triton's: the input's config
shape (`reshape` when it has one) with each -1 as 1, after the batch size of the request's first
input when the model batches (empty strings for TYPE_STRING).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edge_backends.api import (
    Arrays,
    BackendBase,
    InstanceBase,
    InstanceSpec,
    ModelLoadError,
    ModelSignature,
    Outputs,
)
from edge_backends.datatypes import BY_CONFIG


def _int_parameter(parameters: Mapping[str, str], name: str) -> int:
    text = parameters.get(name, "")
    if not text:
        return 0
    try:
        return int(text.strip())
    except ValueError:
        raise ModelLoadError(
            f"parameter '{name}' of the identity backend must be an integer, got '{text}'"
        ) from None


def _dims(entry: Mapping[str, Any]) -> list[int]:
    return [int(d) for d in entry.get("dims", [])]


def check_config(config: Mapping[str, Any]) -> None:
    """Triton's identity backend's config checks, with its texts (INVALID_ARG at load)."""
    inputs = list(config.get("input", []))
    outputs = list(config.get("output", []))
    if len(inputs) != len(outputs):
        raise ModelLoadError("model configuration must have equal input/output pairs")
    by_index: dict[str, tuple[str, list[int]]] = {}
    for entry in inputs:
        name = str(entry.get("name", ""))
        if not name.startswith("INPUT"):
            raise ModelLoadError(
                f"expected input name to follow INPUT<index> pattern, got '{name}'"
            )
        by_index[name[len("INPUT") :]] = (str(entry.get("data_type", "")), _dims(entry))
    for entry in outputs:
        name = str(entry.get("name", ""))
        if not name.startswith("OUTPUT"):
            raise ModelLoadError(
                f"expected output name to follow OUTPUT<index> pattern, got '{name}'"
            )
        index = name[len("OUTPUT") :]
        if index not in by_index:
            raise ModelLoadError("expected input and output indices to match")
        in_type, in_dims = by_index[index]
        out_type = str(entry.get("data_type", ""))
        if in_type != out_type:
            raise ModelLoadError(
                f"expected input and output datatype to match, got {in_type} and {out_type}"
            )
        out_dims = _dims(entry)
        if in_dims != out_dims:
            raise ModelLoadError(
                "expected input and output shape to match, got "
                f"[{','.join(map(str, in_dims))}] and [{','.join(map(str, out_dims))}]"
            )


def optional_inputs(config: Mapping[str, Any]) -> dict[str, tuple[np.dtype[Any], list[int]]]:
    """Each optional input's numpy dtype and its model shape with -1 as 1 (no batch dim)."""
    optional = {}
    for entry in config.get("input", []):
        kind = BY_CONFIG.get(str(entry.get("data_type", "")))
        if not entry.get("optional") or kind is None:
            continue
        reshape = entry.get("reshape")
        if isinstance(reshape, Mapping):  # the model's shape, as the backend sees the input
            dims = [int(d) for d in reshape.get("shape", [])]
        else:
            dims = _dims(entry)
        optional[str(entry.get("name", ""))] = (kind.numpy, [1 if d == -1 else d for d in dims])
    return optional


class IdentityInstance(InstanceBase):
    """Copies INPUT<n> to OUTPUT<n>, after the configured delay; zeros for an optional input
    left out."""

    def __init__(
        self,
        delay_s: float,
        batching: bool = False,
        optional: Mapping[str, tuple[np.dtype[Any], list[int]]] | None = None,
    ) -> None:
        self.delay_s = delay_s
        # A delayed execution sleeps: it must not run on the server's event loop.
        self.runs_inline = delay_s == 0
        self.batching = batching
        self.optional = dict(optional or {})

    def execute(self, inputs: Arrays, output_names: Sequence[str]) -> Outputs:
        if self.delay_s:
            time.sleep(self.delay_s)
        outputs: Outputs = {}
        for name in output_names:
            source = "INPUT" + name[len("OUTPUT") :]
            if not name.startswith("OUTPUT"):
                continue
            if source in inputs:
                outputs[name] = inputs[source]
            elif source in self.optional:
                outputs[name] = self._zeros(inputs, *self.optional[source])
        return outputs

    def _zeros(self, inputs: Arrays, dtype: np.dtype[Any], dims: list[int]) -> np.ndarray[Any, Any]:
        first = next(iter(inputs.values()), None)
        if self.batching:  # the batch of the request's first input (1 when it gave none)
            dims = [first.shape[0] if first is not None and first.ndim else 1, *dims]
        if dtype.kind == "O":
            return np.full(dims, b"", dtype=object)
        return np.zeros(dims, dtype=dtype)

    def close(self) -> None:
        pass


class IdentityBackend(BackendBase):
    name = "identity"

    def inspect(self, model_path: Path) -> ModelSignature:
        # No model file: the config says what the model takes (it must list its tensors).
        return ModelSignature(inputs=(), outputs=())

    def gpu_problem(self) -> str:
        return "'identity' backend only supports CPU instances"

    def create_instance(self, spec: InstanceSpec) -> IdentityInstance:
        check_config(spec.model_config or {})
        parameters = spec.parameters
        creation_delay = _int_parameter(parameters, "creation_delay_sec")
        if creation_delay > 0:
            time.sleep(creation_delay)
        delay_ms = _int_parameter(parameters, "execute_delay_ms")
        multiplier = _int_parameter(parameters, "instance_wise_delay_multiplier")
        if delay_ms > 0 and multiplier > 0:
            delay_ms *= max(multiplier * _instance_index(spec.instance_name), 1)
        config = spec.model_config or {}
        batching = int(config.get("max_batch_size", 0) or 0) > 0
        return IdentityInstance(max(delay_ms, 0) / 1000.0, batching, optional_inputs(config))


def _instance_index(instance_name: str) -> int:
    """The instance's index in its group, from Triton's instance name `<group>_<index>`."""
    tail = instance_name.rsplit("_", 1)[-1]
    return int(tail) if tail.isdigit() else 0
