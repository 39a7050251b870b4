"""OpenVINO backend: IR models (model.xml + model.bin) and ONNX files, on CPU.

The instances of one model version share one compiled model, one OpenVINO *stream* each, so the
weights are in memory once and OpenVINO divides the cores between the streams. Defaults: as many
streams as instances, the process's usable CPUs as the thread budget, the LATENCY hint (each
instance runs one batch at a time). Config `parameters` use Triton's openvino_backend names:

  PERFORMANCE_HINT          LATENCY | THROUGHPUT
  NUM_STREAMS               AUTO | NUMA | n (default: the instance count)
  INFERENCE_NUM_THREADS     n (default: the usable CPUs)
  COMPILATION_NUM_THREADS   n
  HINT_BF16                 YES: bfloat16 inference where the CPU has it (default: f32)
  CPU_EXTENSION_PATH        a shared library of custom operations
  RESHAPE_IO_LAYERS         YES: reshape the model's inputs to the config's dims
  SKIP_OV_DYNAMIC_BATCHSIZE YES: compile for a fixed batch of max_batch_size
  ENABLE_BATCH_PADDING      YES: pad smaller batches up to that fixed batch
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov
import openvino.properties as ov_props
import openvino.properties.hint as ov_hints

from edge_backends.api import (
    Arrays,
    BackendBase,
    ExecutionError,
    InstanceBase,
    InstanceSpec,
    ModelLoadError,
    ModelSignature,
    TensorSpec,
)
from edge_backends.params import Parameters, usable_cpu_count

log = logging.getLogger(__name__)

KNOWN_PARAMETERS = (
    "PERFORMANCE_HINT",
    "NUM_STREAMS",
    "INFERENCE_NUM_THREADS",
    "COMPILATION_NUM_THREADS",
    "HINT_BF16",
    "CPU_EXTENSION_PATH",
    "RESHAPE_IO_LAYERS",
    "SKIP_OV_DYNAMIC_BATCHSIZE",
    "ENABLE_BATCH_PADDING",
)
# OpenVINO element type name -> Triton datatype. bf16 and string tensors are not served.
_DATATYPES = {
    "boolean": "BOOL",
    "u8": "UINT8",
    "u16": "UINT16",
    "u32": "UINT32",
    "u64": "UINT64",
    "i8": "INT8",
    "i16": "INT16",
    "i32": "INT32",
    "i64": "INT64",
    "f16": "FP16",
    "f32": "FP32",
    "f64": "FP64",
}


def _port_names(port: Any) -> set[str]:
    return {str(n) for n in port.get_names()}


def _tensor_spec(port: Any, what: str) -> TensorSpec:
    names = sorted(_port_names(port))
    if not names:
        raise ModelLoadError(f"the model has an unnamed {what}; OpenVINO tensors need a name")
    name = str(port.get_any_name())
    type_name = str(port.get_element_type().get_type_name())
    datatype = _DATATYPES.get(type_name)
    if datatype is None:
        raise ModelLoadError(f"{what} '{name}' has element type {type_name}, which is not served")
    shape = port.get_partial_shape()
    if shape.rank.is_dynamic:
        raise ModelLoadError(f"{what} '{name}' has a dynamic rank; reshape the model first")
    dims = tuple(int(d.get_length()) if d.is_static else -1 for d in shape)
    return TensorSpec(name, datatype, dims)


def _read(core: ov.Core, path: Path) -> ov.Model:
    if not path.is_file():
        raise ModelLoadError(f"model file '{path}' does not exist")
    if path.suffix == ".xml" and not path.with_suffix(".bin").is_file():
        raise ModelLoadError(
            f"'{path}' needs its weights beside it in '{path.with_suffix('.bin')}'"
        )
    try:
        return core.read_model(str(path))
    except Exception as exc:  # OpenVINO raises RuntimeError subclasses of its own
        raise ModelLoadError(f"openvino cannot read '{path}': {exc}") from exc


def _config_tensors(config: Mapping[str, Any], kind: str) -> list[Mapping[str, Any]]:
    return list(config.get(kind) or [])


def _entry_dims(entry: Mapping[str, Any]) -> list[int]:
    reshape = entry.get("reshape")
    if reshape and reshape.get("shape") is not None:
        return [int(d) for d in reshape["shape"]]
    return [int(d) for d in entry.get("dims", [])]


class _Compiled:
    """One compiled model shared by the instances of a model version."""

    def __init__(self, compiled: Any, static_batch: int | None, pad: bool) -> None:
        self.compiled = compiled
        self.static_batch = static_batch
        self.pad = pad
        self.users = 0
        self.inputs = {n: i for i, p in enumerate(compiled.inputs) for n in _port_names(p)}
        self.outputs = {n: i for i, p in enumerate(compiled.outputs) for n in _port_names(p)}


class OpenVinoInstance(InstanceBase):
    """One infer request on a shared compiled model (one OpenVINO stream)."""

    def __init__(
        self, backend: OpenVinoBackend, key: tuple[Any, ...], shared: _Compiled, model: str
    ) -> None:
        self._backend = backend
        self._key = key
        self._shared = shared
        self._model = model
        self._request = shared.compiled.create_infer_request()

    def _padded(self, inputs: Arrays) -> tuple[dict[int, np.ndarray[Any, Any]], int]:
        feed: dict[int, np.ndarray[Any, Any]] = {}
        batch = 0
        fixed = self._shared.static_batch
        for name, array in inputs.items():
            index = self._shared.inputs.get(name)
            if index is None:
                raise ExecutionError(f"model '{self._model}' has no input '{name}'")
            batch = int(array.shape[0]) if array.ndim else 0
            if fixed is not None and batch != fixed:
                if batch > fixed or not self._shared.pad:
                    raise ExecutionError(
                        f"model '{self._model}' input '{name}': batch of {batch}, but the model "
                        f"is compiled for a batch of exactly {fixed} (SKIP_OV_DYNAMIC_BATCHSIZE); "
                        "set ENABLE_BATCH_PADDING: YES to pad smaller batches"
                    )
                pad = np.zeros((fixed - batch, *array.shape[1:]), dtype=array.dtype)
                array = np.concatenate([array, pad])
            feed[index] = array
        return feed, batch

    def execute(
        self, inputs: Arrays, output_names: Sequence[str]
    ) -> dict[str, np.ndarray[Any, Any]]:
        feed, batch = self._padded(inputs)
        try:
            # share_inputs: no copy in (the call is synchronous); outputs are copied out.
            results = self._request.infer(feed, share_inputs=True)
        except Exception as exc:  # OpenVINO raises untyped errors (shapes, kernels)
            raise ExecutionError(f"model '{self._model}': openvino failed: {exc}") from exc
        out: dict[str, np.ndarray[Any, Any]] = {}
        for name in output_names:
            index = self._shared.outputs.get(name)
            if index is None:
                raise ExecutionError(f"model '{self._model}' has no output '{name}'")
            array = results[index]
            if self._shared.static_batch is not None and batch < self._shared.static_batch:
                array = array[:batch]
            out[name] = array
        return out

    def close(self) -> None:
        self._backend.release(self._key)


class OpenVinoBackend(BackendBase):
    """Reads IR or ONNX files with OpenVINO and compiles them for the CPU."""

    name = "openvino"

    def __init__(self) -> None:
        self._core: ov.Core | None = None
        self._lock = threading.Lock()
        self._extensions: set[str] = set()
        self._compiled: dict[tuple[Any, ...], _Compiled] = {}

    @property
    def core(self) -> ov.Core:
        with self._lock:
            if self._core is None:
                self._core = ov.Core()
            return self._core

    def inspect(self, model_path: Path) -> ModelSignature:
        model = _read(self.core, model_path)
        return ModelSignature(
            inputs=tuple(_tensor_spec(p, "input") for p in model.inputs),
            outputs=tuple(_tensor_spec(p, "output") for p in model.outputs),
        )

    def gpu_problem(self) -> str:
        """Why KIND_GPU instances cannot run on a GPU here (always: this backend is CPU-only)."""
        return "the openvino backend runs on CPU only"

    def create_instance(self, spec: InstanceSpec) -> OpenVinoInstance:
        config = spec.model_config or {}
        params = Parameters(spec.model_name, "openvino", spec.parameters)
        stat = spec.model_path.stat() if spec.model_path.exists() else None
        key = (
            str(spec.model_path),
            spec.model_version,
            (stat.st_mtime_ns, stat.st_size) if stat else None,
            tuple(sorted(spec.parameters.items())),
            spec.instance_count,
            repr(config.get("max_batch_size")),
            repr(config.get("input")),
        )
        with self._lock:
            shared = self._compiled.get(key)
        if shared is None:
            shared = self._compile(spec, config, params)
            with self._lock:
                shared = self._compiled.setdefault(key, shared)
        with self._lock:
            shared.users += 1
        return OpenVinoInstance(self, key, shared, spec.model_name)

    def release(self, key: tuple[Any, ...]) -> None:
        with self._lock:
            shared = self._compiled.get(key)
            if shared is not None:
                shared.users -= 1
                if shared.users <= 0:
                    del self._compiled[key]

    def _compile(
        self, spec: InstanceSpec, config: Mapping[str, Any], params: Parameters
    ) -> _Compiled:
        unknown = params.unknown(KNOWN_PARAMETERS)
        if unknown:
            log.warning(
                "model '%s': %s are not openvino_backend parameters; ignored (known: %s)",
                spec.model_name,
                unknown,
                ", ".join(KNOWN_PARAMETERS),
            )
        core = self.core
        extension = params.raw("CPU_EXTENSION_PATH")
        if extension is not None:
            self._add_extension(spec.model_name, extension)
        model = _read(core, spec.model_path)
        max_batch = int(config.get("max_batch_size") or 0)
        shapes: dict[str, ov.PartialShape] = {}
        if params.boolean("RESHAPE_IO_LAYERS", False):
            for entry in _config_tensors(config, "input"):
                dims = ([-1] if max_batch > 0 else []) + _entry_dims(entry)
                shapes[str(entry["name"])] = ov.PartialShape(dims)
        static_batch = None
        if max_batch > 0 and params.boolean("SKIP_OV_DYNAMIC_BATCHSIZE", False):
            static_batch = max_batch
            for port in model.inputs:
                name = str(port.get_any_name())
                current = shapes.get(name, port.get_partial_shape())
                dims = [int(d.get_length()) if d.is_static else -1 for d in current]
                shapes[name] = ov.PartialShape([max_batch, *dims[1:]])
        if shapes:
            try:
                model.reshape(shapes)
            except Exception as exc:
                wanted = {k: str(v) for k, v in shapes.items()}
                raise ModelLoadError(
                    f"model '{spec.model_name}': openvino cannot reshape the inputs to "
                    f"{wanted}: {exc}"
                ) from exc
        properties = self._properties(spec, params)
        try:
            compiled = core.compile_model(model, "CPU", properties)
        except Exception as exc:
            raise ModelLoadError(
                f"model '{spec.model_name}': openvino cannot compile '{spec.model_path}': {exc}"
            ) from exc
        pad = params.boolean("ENABLE_BATCH_PADDING", False)
        log.info(
            "model '%s' version %d: openvino compiled for CPU, %s streams, %s threads, hint %s, "
            "precision %s",
            spec.model_name,
            spec.model_version,
            compiled.get_property(ov_props.num_streams()),
            compiled.get_property(ov_props.inference_num_threads()),
            compiled.get_property(ov_hints.performance_mode()),
            compiled.get_property(ov_hints.inference_precision()).get_type_name(),
        )
        return _Compiled(compiled, static_batch, pad)

    def _properties(self, spec: InstanceSpec, params: Parameters) -> dict[Any, Any]:
        hint = params.choice("PERFORMANCE_HINT", ("LATENCY", "THROUGHPUT"), "LATENCY")
        properties: dict[Any, Any] = {
            ov_hints.performance_mode(): getattr(ov_hints.PerformanceMode, str(hint)),
            ov_props.inference_num_threads(): params.integer(
                "INFERENCE_NUM_THREADS", usable_cpu_count()
            ),
        }
        streams = params.raw("NUM_STREAMS")
        if streams is None:
            properties[ov_props.num_streams()] = max(1, spec.instance_count)
        elif streams.upper() in ("AUTO", "NUMA"):
            properties[ov_props.num_streams()] = getattr(ov_props.streams.Num, streams.upper())
        elif streams.isdigit() and int(streams) >= 1:
            properties[ov_props.num_streams()] = int(streams)
        else:
            raise ModelLoadError(
                f"model '{spec.model_name}': openvino parameter 'NUM_STREAMS' must be AUTO, "
                f"NUMA or an integer >= 1, got '{streams}'"
            )
        compile_threads = params.integer("COMPILATION_NUM_THREADS", 0)
        if compile_threads:
            properties[ov_props.compilation_num_threads()] = compile_threads
        # f32 unless the config says HINT_BF16: YES. Left unset, OpenVINO's CPU plugin picks
        # bf16 on CPUs with AVX512_BF16 or AMX, so results would depend on the CPU: bf16 keeps
        # 8 significant bits (SqueezeNet's logits 2% off ONNX Runtime's, against 3e-7 in f32;
        # near-equal logits round together and a softmax over them comes out uniform).
        bf16 = params.boolean("HINT_BF16", False)
        properties[ov_hints.inference_precision()] = ov.Type.bf16 if bf16 else ov.Type.f32
        return properties

    def _add_extension(self, model: str, path: str) -> None:
        core = self.core
        with self._lock:
            if path in self._extensions:
                return
            if not Path(path).is_absolute() or not Path(path).is_file():
                raise ModelLoadError(
                    f"model '{model}': openvino parameter 'CPU_EXTENSION_PATH' must be the "
                    f"absolute path of a shared library, got '{path}'"
                )
            try:
                core.add_extension(path)
            except Exception as exc:
                raise ModelLoadError(
                    f"model '{model}': openvino cannot load the extension '{path}': {exc}"
                ) from exc
            self._extensions.add(path)
