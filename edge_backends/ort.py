"""ONNX Runtime backend: CPU, and the CUDA and TensorRT execution providers for KIND_GPU
instances where this onnxruntime build has them (ort_providers.py picks them).

Threading: ONNX Runtime releases the GIL in `run`, so each instance runs on its own worker thread.
ORT's default of one intra-op thread per core, spinning while idle, fights the event loop and the
other instances for the same cores (measured: up to half the throughput lost under load), so the
default here splits the cores this process may use between the model's instances and turns
spinning off. Config `parameters` override both, using onnxruntime_backend's names.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from edge_backends.api import (
    Arrays,
    BackendBase,
    ExecutionError,
    InputRejected,
    InstanceBase,
    InstanceSpec,
    ModelLoadError,
    ModelSignature,
    Placement,
    TensorSpec,
)
from edge_backends.datatypes import BY_ONNX
from edge_backends.onnx_check import OnnxFileProblem, check_onnx_file
from edge_backends.ort_providers import CPU, CUDA, fallen_back, plan_providers
from edge_backends.params import Parameters, threads_per_instance

log = logging.getLogger(__name__)

# onnxruntime_backend: level -1 is basic, 1 is extended, anything else (the default) is all.
_GRAPH_LEVELS = {
    -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
}


def session_options(spec: InstanceSpec) -> ort.SessionOptions:
    """SessionOptions from the instance spec, with edge-friendly thread defaults."""
    opts = ort.SessionOptions()
    params = Parameters(spec.model_name, "onnxruntime", spec.parameters)
    per_instance = threads_per_instance(spec.instance_count)
    opts.intra_op_num_threads = params.integer("intra_op_thread_count", per_instance)
    opts.inter_op_num_threads = params.integer("inter_op_thread_count", 1)
    if params.integer("execution_mode", 0) == 1:
        opts.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    spinning = "1" if params.boolean("allow_spinning", False) else "0"
    opts.add_session_config_entry("session.intra_op.allow_spinning", spinning)
    opts.add_session_config_entry("session.inter_op.allow_spinning", spinning)
    opts.enable_cpu_mem_arena = params.boolean("enable_mem_arena", True)
    opts.enable_mem_pattern = params.boolean("enable_mem_pattern", True)
    level = spec.graph_optimization_level
    opts.graph_optimization_level = _GRAPH_LEVELS.get(
        level if level is not None else 0, ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    )
    opts.log_severity_level = 3  # errors only: ORT's warnings are noise in a journal
    return opts


def _open_session(
    path: Path,
    opts: ort.SessionOptions,
    providers: list[tuple[str, dict[str, str]]] | None = None,
) -> ort.InferenceSession:
    if not path.is_file():
        raise ModelLoadError(f"model file '{path}' does not exist")
    try:
        check_onnx_file(path)  # what it would read and allocate, before ORT does
    except (OnnxFileProblem, OSError) as exc:
        raise ModelLoadError(f"onnxruntime will not load '{path}': {exc}") from None
    try:
        return ort.InferenceSession(
            str(path), sess_options=opts, providers=providers or [(CPU, {})]
        )
    except Exception as exc:  # ORT raises its own untyped errors for bad files
        raise ModelLoadError(f"onnxruntime cannot load '{path}': {exc}") from exc


def _tensor_specs(args: Sequence[Any]) -> tuple[TensorSpec, ...]:
    specs = []
    for arg in args:
        dtype = BY_ONNX.get(arg.type)
        if dtype is None:
            raise ModelLoadError(f"tensor '{arg.name}' has unsupported type {arg.type}")
        # Symbolic (str) and unknown (None) dimensions are dynamic.
        shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in (arg.shape or ()))
        specs.append(TensorSpec(arg.name, dtype.triton, shape))
    return tuple(specs)


def _to_ort_strings(name: str, array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """ONNX Runtime's Python binding takes str, not bytes, and only valid UTF-8."""
    out = np.empty(array.shape, dtype=np.object_)
    flat_in, flat_out = array.reshape(-1), out.reshape(-1)
    for i, item in enumerate(flat_in):
        if isinstance(item, bytes):
            try:
                item = item.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputRejected(
                    f"input '{name}' element {i} is not valid UTF-8 ({exc.reason}); "
                    "ONNX string tensors hold UTF-8 text"
                ) from None
        flat_out[i] = item
    return out


def _from_ort_strings(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    out = np.empty(array.shape, dtype=np.object_)
    flat_in, flat_out = array.reshape(-1), out.reshape(-1)
    for i, item in enumerate(flat_in):
        flat_out[i] = item.encode("utf-8") if isinstance(item, str) else item
    return out


class OrtInstance(InstanceBase):
    """One InferenceSession."""

    def __init__(
        self, session: ort.InferenceSession, placement_note: str = "", on_gpu: bool = False
    ) -> None:
        self._session = session
        self._run_options = ort.RunOptions()
        # A CPU session runs through the binding's own `run`: InferenceSession.run's checks in
        # Python (required inputs present, WebGPU graph capture, OrtValue ownership) cost 2-4 us
        # a call, as much as a tiny model's whole execution, and the server has checked the
        # inputs already (a missing one still fails in ORT, as an ExecutionError). A session
        # with another provider keeps the public `run`: its fallback to CPU lives there.
        # tests/unit/test_ort_fast_run.py pins the internal.
        binding = getattr(session, "_sess", None)
        cpu_only = session.get_providers() == [CPU]
        self._run = binding.run if cpu_only and binding is not None else session.run
        # A model without string tensors (nearly every one) hands its inputs to ORT and its
        # outputs back as they are: no per-call look at each array's dtype. On the server's
        # core right after a SqueezeNet run (caches cold) the per-array checks cost 15-30 us a
        # request, as much as the rest of `execute` (`python -m bench.squeeze_probe execute`).
        self._has_strings = any(
            arg.type == "tensor(string)" for arg in (*session.get_inputs(), *session.get_outputs())
        )
        # Where the session's providers really run (a GPU session may fall back to CPU).
        self.placement = Placement("KIND_GPU" if on_gpu else "KIND_CPU", placement_note)

    def execute(
        self, inputs: Arrays, output_names: Sequence[str]
    ) -> dict[str, np.ndarray[Any, Any]]:
        names = list(output_names)
        feed = (
            {
                name: _to_ort_strings(name, array) if array.dtype == np.object_ else array
                for name, array in inputs.items()
            }
            if self._has_strings
            else inputs
        )
        try:
            results = self._run(names, feed, self._run_options)
        except Exception as exc:  # ORT raises untyped errors (bad shapes, kernel failures)
            raise ExecutionError(f"onnxruntime failed: {exc}") from exc
        if not self._has_strings:
            return dict(zip(names, results, strict=True))
        return {
            name: _from_ort_strings(r) if r.dtype == np.object_ else r
            for name, r in zip(names, results, strict=True)
        }

    def close(self) -> None:
        # `_run` (the binding's or the session's bound `run`) holds the session too: both go,
        # so its memory (weights, arena) is given back at the close, not when the last
        # reference to this instance goes (the memory budget measures an unload's return).
        del self._session
        del self._run


class OrtBackend(BackendBase):
    """Loads .onnx files into sessions on CPU, or on a GPU for KIND_GPU instances."""

    name = "onnxruntime"

    def inspect(self, model_path: Path) -> ModelSignature:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        opts.log_severity_level = 3
        session = _open_session(model_path, opts)
        return ModelSignature(
            inputs=_tensor_specs(session.get_inputs()),
            outputs=_tensor_specs(session.get_outputs()),
        )

    def gpu_problem(self) -> str:
        """Why ONNX Runtime cannot run on a GPU here ('' when it can)."""
        if CUDA not in ort.get_available_providers():
            return "no usable GPU (this onnxruntime has no CUDA execution provider)"
        return ""

    def create_instance(self, spec: InstanceSpec) -> OrtInstance:
        plan = plan_providers(
            spec.kind,
            spec.device_id,
            spec.gpu_accelerators,
            ort.get_available_providers(),
            spec.cache_dir,
        )
        opts = session_options(spec)
        if plan.names == [CPU]:
            return OrtInstance(_open_session(spec.model_path, opts))
        try:
            session = _open_session(spec.model_path, opts, plan.providers)
        except ModelLoadError as exc:
            # Out of GPU memory, a broken driver: serve on CPU rather than not at all.
            cpu = _open_session(spec.model_path, session_options(spec))
            return OrtInstance(cpu, f"the GPU session failed ({exc}); running on CPU")
        moved = fallen_back(plan, session.get_providers())
        note = "; ".join(n for n in (*plan.notes, moved) if n)
        return OrtInstance(session, note, on_gpu=not moved)
