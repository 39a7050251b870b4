"""Triton's `identity` backend: each requested OUTPUT<n> is a copy of INPUT<n>.

Tritonserver ships it (`backend: "identity"`, no model file: the version folder may be empty)
and its own test suites, perf_analyzer's examples and many users' smoke tests build models on
it. The same rules as Triton's: the config lists as many inputs as outputs, named INPUT<n> and
OUTPUT<n>, each pair with the same datatype and dims; `parameters` `execute_delay_ms` (each
execution sleeps that long, times the instance's index when `instance_wise_delay_multiplier`
is set) and `creation_delay_sec` (each instance takes that long to load). An output whose input
the request left out (an optional input) is left out of the response.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from edge_backends.api import (
    Arrays,
    BackendBase,
    InstanceBase,
    InstanceSpec,
    ModelLoadError,
    ModelSignature,
    Outputs,
)


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


class IdentityInstance(InstanceBase):
    """Copies INPUT<n> to OUTPUT<n>, after the configured delay."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        # A delayed execution sleeps: it must not run on the server's event loop.
        self.runs_inline = delay_s == 0

    def execute(self, inputs: Arrays, output_names: Sequence[str]) -> Outputs:
        if self.delay_s:
            time.sleep(self.delay_s)
        outputs: Outputs = {}
        for name in output_names:
            source = "INPUT" + name[len("OUTPUT") :]
            if name.startswith("OUTPUT") and source in inputs:
                outputs[name] = inputs[source]
        return outputs

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
        return IdentityInstance(max(delay_ms, 0) / 1000.0)


def _instance_index(instance_name: str) -> int:
    """The instance's index in its group, from Triton's instance name `<group>_<index>`."""
    tail = instance_name.rsplit("_", 1)[-1]
    return int(tail) if tail.isdigit() else 0
