"""PyTorch backend: TorchScript files (model.pt, made with torch.jit.script / trace and save).

TorchScript carries no typed signature, so config.pbtxt lists the inputs and outputs. Names map
to the model as in Triton's pytorch_backend:
  inputs   the forward() argument names, else `NAME__<index>` (e.g. INPUT__0 is the first
           argument), else the order of the config's input list;
  outputs  `NAME__<index>` (the index into the tuple forward() returns), else config order.

Parameters (Triton's names): INFERENCE_MODE (default false: run under no_grad),
DISABLE_OPTIMIZED_EXECUTION, INTRA_OP_THREAD_COUNT (default: the usable CPUs split between the
model's instances), INTER_OP_THREAD_COUNT, ENABLE_CACHE_CLEANING (GPU). ENABLE_NVFUSER,
ENABLE_JIT_EXECUTOR, ENABLE_JIT_PROFILING, ENABLE_TENSOR_FUSER and ENABLE_WEIGHT_SHARING are
accepted and ignored (logged): the first is gone from current PyTorch, the others are
process-wide switches that would change every other model's execution.
"""

from __future__ import annotations

import contextlib
import logging
import re
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edge_backends.api import (
    Arrays,
    BackendBase,
    ExecutionError,
    InstanceBase,
    InstanceSpec,
    ModelLoadError,
    ModelSignature,
)
from edge_backends.datatypes import BY_CONFIG
from edge_backends.params import Parameters, threads_per_instance

log = logging.getLogger(__name__)

USED_PARAMETERS = (
    "INFERENCE_MODE",
    "DISABLE_OPTIMIZED_EXECUTION",
    "INTRA_OP_THREAD_COUNT",
    "INTER_OP_THREAD_COUNT",
    "ENABLE_CACHE_CLEANING",
)
IGNORED_PARAMETERS = (
    "ENABLE_NVFUSER",
    "ENABLE_JIT_EXECUTOR",
    "ENABLE_JIT_PROFILING",
    "ENABLE_TENSOR_FUSER",
    "ENABLE_WEIGHT_SHARING",
)
_NAMED_INDEX = re.compile(r"^.+__(\d+)$")


def _index_of(name: str) -> int | None:
    match = _NAMED_INDEX.match(name)
    return int(match.group(1)) if match else None


def input_positions(config_names: Sequence[str], forward_args: Sequence[str]) -> dict[str, int]:
    """Config input name -> forward() argument position, by Triton's naming conventions."""
    if all(n in forward_args for n in config_names):
        return {n: forward_args.index(n) for n in config_names}
    indexes = [_index_of(n) for n in config_names]
    if all(i is not None for i in indexes):
        return {n: int(i) for n, i in zip(config_names, indexes, strict=True) if i is not None}
    return {n: i for i, n in enumerate(config_names)}


def output_positions(config_names: Sequence[str]) -> dict[str, int]:
    """Config output name -> index in forward()'s returned tuple."""
    indexes = [_index_of(n) for n in config_names]
    if all(i is not None for i in indexes):
        return {n: int(i) for n, i in zip(config_names, indexes, strict=True) if i is not None}
    return {n: i for i, n in enumerate(config_names)}


def _names(config: Mapping[str, Any], kind: str) -> list[str]:
    return [str(entry["name"]) for entry in config.get(kind) or []]


class TorchInstance(InstanceBase):
    """One loaded TorchScript module on one device."""

    def __init__(
        self,
        spec: InstanceSpec,
        module: Any,
        device: torch.device,
        params: Parameters,
    ) -> None:
        config = spec.model_config or {}
        self._model = spec.model_name
        self._module = module
        self._device = device
        forward_args = [a.name for a in module.forward.schema.arguments][1:]  # minus self
        self._inputs = input_positions(_names(config, "input"), forward_args)
        self._arity = len(forward_args)
        for name, position in self._inputs.items():
            if position >= self._arity:
                raise ModelLoadError(
                    f"model '{self._model}' input '{name}': forward() takes {self._arity} "
                    f"argument(s) {forward_args}, so there is no argument {position}"
                )
        self._outputs = output_positions(_names(config, "output"))
        self._out_dtypes = {
            str(e["name"]): BY_CONFIG[str(e["data_type"])].numpy
            for e in config.get("output") or []
            if str(e.get("data_type")) in BY_CONFIG
        }
        self._inference_mode = params.boolean("INFERENCE_MODE", False)
        self._optimized = not params.boolean("DISABLE_OPTIMIZED_EXECUTION", False)
        self._clean_cache = params.boolean("ENABLE_CACHE_CLEANING", False)

    @contextlib.contextmanager
    def _modes(self) -> Iterator[None]:
        # Both guards are thread-local, so each instance's worker thread keeps its own.
        grad = torch.inference_mode() if self._inference_mode else torch.no_grad()
        with grad, torch.jit.optimized_execution(self._optimized):
            yield

    def _tensor(self, array: np.ndarray[Any, Any]) -> torch.Tensor:
        if array.dtype == np.object_:
            raise ExecutionError(f"model '{self._model}': string tensors are not supported")
        if not array.flags.writeable:  # a model may write into its inputs in place
            array = array.copy()
        return torch.from_numpy(array).to(self._device)

    def execute(
        self, inputs: Arrays, output_names: Sequence[str]
    ) -> dict[str, np.ndarray[Any, Any]]:
        args: list[Any] = [None] * self._arity
        for name, array in inputs.items():
            position = self._inputs.get(name)
            if position is None:
                raise ExecutionError(f"model '{self._model}' has no input '{name}'")
            args[position] = self._tensor(array)
        try:
            with self._modes():
                result = self._module(*args)
        except Exception as exc:  # TorchScript raises its own errors (shapes, asserts)
            raise ExecutionError(f"model '{self._model}': pytorch failed: {exc}") from exc
        returned = list(result) if isinstance(result, (tuple, list)) else [result]
        out: dict[str, np.ndarray[Any, Any]] = {}
        for name in output_names:
            index = self._outputs.get(name)
            if index is None or index >= len(returned):
                raise ExecutionError(
                    f"model '{self._model}' output '{name}': forward() returned "
                    f"{len(returned)} value(s), no value at index {index}"
                )
            value = returned[index]
            if not isinstance(value, torch.Tensor):
                raise ExecutionError(
                    f"model '{self._model}' output '{name}': forward() returned a "
                    f"{type(value).__name__}, not a tensor"
                )
            array = value.detach().cpu().numpy()
            wanted = self._out_dtypes.get(name)
            if wanted is not None and array.dtype != wanted:
                raise ExecutionError(
                    f"model '{self._model}' output '{name}': the model returned {array.dtype}, "
                    f"the config says {wanted}"
                )
            out[name] = array
        if self._clean_cache and self._device.type == "cuda":
            torch.cuda.empty_cache()
        return out

    def close(self) -> None:
        del self._module


class TorchBackend(BackendBase):
    """Loads TorchScript archives with torch.jit.load."""

    name = "pytorch"

    def inspect(self, model_path: Path) -> ModelSignature:
        if not model_path.is_file():
            raise ModelLoadError(f"model file '{model_path}' does not exist")
        if not zipfile.is_zipfile(model_path):
            raise ModelLoadError(
                f"'{model_path}' is not a TorchScript archive (save one with "
                "torch.jit.script(module).save(path) or torch.jit.trace)"
            )
        return ModelSignature(inputs=(), outputs=())  # the config says what the model takes

    def gpu_problem(self) -> str:
        """Why torch cannot run on a GPU here ('' when it can)."""
        if not torch.cuda.is_available():
            build = "has no CUDA" if torch.version.cuda is None else "finds no CUDA device"
            return f"no usable GPU (this torch {torch.__version__} {build})"
        return ""

    def create_instance(self, spec: InstanceSpec) -> TorchInstance:
        params = Parameters(spec.model_name, "pytorch", spec.parameters)
        self._threads(spec, params)
        for key in spec.parameters:
            if key in IGNORED_PARAMETERS:
                log.warning("model '%s': parameter '%s' is ignored here", spec.model_name, key)
            elif key not in USED_PARAMETERS:
                log.warning(
                    "model '%s': '%s' is not a pytorch_backend parameter; ignored",
                    spec.model_name,
                    key,
                )
        for entry in (spec.model_config or {}).get("input") or []:
            if entry.get("data_type") == "TYPE_STRING":
                raise ModelLoadError(
                    f"model '{spec.model_name}' input '{entry['name']}': string inputs are "
                    "not supported by the pytorch backend"
                )
        device = torch.device("cpu")
        if spec.kind == "KIND_GPU":
            count = torch.cuda.device_count()
            if spec.device_id >= count:
                raise ModelLoadError(
                    f"model '{spec.model_name}' instance '{spec.instance_name}': GPU "
                    f"{spec.device_id} does not exist ({count} CUDA device(s))"
                )
            device = torch.device(f"cuda:{spec.device_id}")
        self.inspect(spec.model_path)
        try:
            module = torch.jit.load(str(spec.model_path), map_location=device)
        except Exception as exc:  # torch raises RuntimeError with the archive's problem
            raise ModelLoadError(f"pytorch cannot load '{spec.model_path}': {exc}") from exc
        module.eval()
        return TorchInstance(spec, module, device, params)

    def _threads(self, spec: InstanceSpec, params: Parameters) -> None:
        # Both pools are process-wide in PyTorch: the last model loaded sets the intra-op size.
        intra = params.integer("INTRA_OP_THREAD_COUNT", 0)
        torch.set_num_threads(intra if intra > 0 else threads_per_instance(spec.instance_count))
        inter = params.integer("INTER_OP_THREAD_COUNT", 0)
        if inter > 0 and inter != torch.get_num_interop_threads():
            try:
                torch.set_num_interop_threads(inter)
            except RuntimeError:  # only settable before the first inter-op work
                log.warning(
                    "model '%s': INTER_OP_THREAD_COUNT %d ignored: the process-wide inter-op "
                    "pool already has %d threads",
                    spec.model_name,
                    inter,
                    torch.get_num_interop_threads(),
                )
