"""TensorRT engines (`platform: "tensorrt_plan"`, `model.plan`). Unverified on hardware: written
against TensorRT's documented named-tensor API (TensorRT 10 and later); the decisions around it
live in trt_engine.py and are tested without a GPU, the device memory in cuda_device.py is tested
on a GPU by tests/gpu/run_device_checks.sh.

Each instance owns one execution context and one CUDA stream, and keeps its device buffers and
pinned host buffers between batches, growing them when a batch needs more. A batch runs as:
pick the optimization profile that holds the input shapes, set the shapes, copy the inputs to
pinned memory and on to the device, enqueue, copy the outputs back, wait for the stream.
"""

from __future__ import annotations

import collections
import logging
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tensorrt as trt

from edge_backends.api import (
    Arrays,
    BackendBase,
    ExecutionError,
    InstanceBase,
    InstanceSpec,
    ModelLoadError,
    ModelSignature,
)
from edge_backends.cuda_device import (
    CudaDevice,
    DeviceBuffer,
    DeviceError,
    DeviceUnavailable,
    open_device,
)
from edge_backends.datatypes import BY_TRITON
from edge_backends.trt_engine import (
    TRT_TO_TRITON,
    EngineDescription,
    EngineTensor,
    ProfileRange,
    allowed_profiles,
    auto_complete,
    explain_deserialize_failure,
    select_profile,
    signature,
)

log = logging.getLogger(__name__)


class _CapturingLogger(trt.ILogger):  # type: ignore[misc]
    """Keeps TensorRT's errors of one call, so the load error can quote them."""

    def __init__(self) -> None:
        trt.ILogger.__init__(self)
        self.messages: collections.deque[str] = collections.deque(maxlen=20)

    def log(self, severity: Any, msg: str) -> None:
        levels = trt.ILogger.Severity
        if severity in (levels.INTERNAL_ERROR, levels.ERROR):
            log.error("tensorrt: %s", msg)
        if severity in (levels.INTERNAL_ERROR, levels.ERROR, levels.WARNING):
            self.messages.append(msg)  # the last few, for a load error to quote
            log.debug("tensorrt: %s", msg)


def describe_engine(engine: Any, device_name: str = "") -> EngineDescription:
    """Record what a deserialized ICudaEngine declares."""
    tensors = []
    for index in range(engine.num_io_tensors):
        name = engine.get_tensor_name(index)
        is_input = engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
        kind = engine.get_tensor_dtype(name).name
        datatype = TRT_TO_TRITON.get(kind)
        if datatype is None:
            raise ModelLoadError(
                f"engine tensor '{name}' has TensorRT type {kind}, which has no Triton datatype"
            )
        profiles: tuple[ProfileRange, ...] = ()
        if is_input:
            profiles = tuple(
                ProfileRange(*(tuple(int(d) for d in s) for s in
                               engine.get_tensor_profile_shape(name, p)))
                for p in range(engine.num_optimization_profiles)
            )
        shape = tuple(int(d) for d in engine.get_tensor_shape(name))
        tensors.append(EngineTensor(name, is_input, datatype, shape, profiles))
    return EngineDescription(
        tensors=tuple(tensors),
        num_profiles=int(engine.num_optimization_profiles),
        trt_version=str(trt.__version__),
        device_name=device_name,
    )


class LoadedEngine:
    """A deserialized engine and the runtime that owns it.

    Instances share one only when their instance groups name their optimization profiles
    (`profile: [...]`), as in Triton: TensorRT has let only one execution context at a time use
    a given profile of an engine, so instances that pick profiles per batch get an engine each."""

    def __init__(self, path: Path) -> None:
        if not path.is_file():
            raise ModelLoadError(f"model file '{path}' does not exist")
        # TensorRT needs the logger alive for as long as what the runtime created.
        self.logger = _CapturingLogger()
        self.runtime = trt.Runtime(self.logger)
        self.engine = self.runtime.deserialize_cuda_engine(path.read_bytes())
        if self.engine is None:
            raise ModelLoadError(
                explain_deserialize_failure(list(self.logger.messages), str(trt.__version__))
            )


class TrtInstance(InstanceBase):
    """One execution context and stream on one GPU."""

    def __init__(self, spec: InstanceSpec, device: CudaDevice, loaded: LoadedEngine) -> None:
        self._device = device
        self._lock = threading.Lock()
        self._loaded = loaded  # kept alive while this instance is
        with device.activate():
            self.description = describe_engine(loaded.engine, device.name)
            self._context = loaded.engine.create_execution_context()
            if self._context is None:
                raise ModelLoadError("TensorRT could not create an execution context (GPU memory?)")
            self._stream = device.create_stream()
        self._allowed = allowed_profiles(spec.profiles, self.description)
        self._profile = -1
        self._device_buffers: dict[str, DeviceBuffer] = {}
        self._pinned: dict[str, np.ndarray[Any, np.dtype[np.uint8]]] = {}

    def _buffers(self, name: str, nbytes: int) -> tuple[DeviceBuffer, np.ndarray[Any, Any]]:
        """The device and pinned host buffers for a tensor, at least `nbytes` long."""
        current = self._device_buffers.get(name)
        if current is None or current.nbytes < nbytes:
            # Forget the old pair first: if an allocation fails, nothing dangles.
            self._device_buffers.pop(name, None)
            self._pinned.pop(name, None)
            if current is not None:
                self._device.free(current)
            size = max(nbytes, 2 * current.nbytes if current else nbytes)
            buffer = self._device.alloc(size)
            try:
                pinned = self._device.alloc_pinned(size)
            except DeviceError:
                self._device.free(buffer)
                raise
            self._device_buffers[name], self._pinned[name] = buffer, pinned
        return self._device_buffers[name], self._pinned[name]

    def execute(
        self, inputs: Arrays, output_names: Sequence[str]
    ) -> dict[str, np.ndarray[Any, Any]]:
        shapes = {name: tuple(array.shape) for name, array in inputs.items()}
        try:
            profile = select_profile(self.description, shapes, self._allowed)
        except ModelLoadError as exc:
            raise ExecutionError(str(exc)) from None
        with self._lock, self._device.activate():
            try:
                return self._run(profile, inputs, output_names)
            except DeviceError as exc:
                raise ExecutionError(f"CUDA: {exc}") from exc

    def _run(
        self, profile: int, inputs: Arrays, output_names: Sequence[str]
    ) -> dict[str, np.ndarray[Any, Any]]:
        device, context, stream = self._device, self._context, self._stream
        handle = device.stream_handle(stream)
        if profile != self._profile:
            context.set_optimization_profile_async(profile, handle)
            self._profile = profile
        for tensor in self.description.inputs:
            array = np.ascontiguousarray(
                inputs[tensor.name], dtype=BY_TRITON[tensor.datatype].numpy
            )
            if not context.set_input_shape(tensor.name, array.shape):
                raise ExecutionError(
                    f"TensorRT refused shape {list(array.shape)} for '{tensor.name}'"
                )
            buffer, pinned = self._buffers(tensor.name, array.nbytes)
            staged = pinned[: array.nbytes]
            staged[:] = array.reshape(-1).view(np.uint8)
            device.copy_to_device(buffer, staged, stream)
            context.set_tensor_address(tensor.name, buffer.ptr)
        results: dict[str, tuple[np.ndarray[Any, Any], tuple[int, ...], np.dtype[Any]]] = {}
        for tensor in self.description.outputs:
            shape = tuple(int(d) for d in context.get_tensor_shape(tensor.name))
            if any(d < 0 for d in shape):
                raise ExecutionError(
                    f"output '{tensor.name}' has a data-dependent shape {list(shape)}, which this "
                    "backend does not support"
                )
            dtype = BY_TRITON[tensor.datatype].numpy
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            buffer, pinned = self._buffers(tensor.name, nbytes)
            context.set_tensor_address(tensor.name, buffer.ptr)
            results[tensor.name] = (pinned[:nbytes], shape, dtype)
        if not context.execute_async_v3(handle):
            raise ExecutionError("TensorRT failed to enqueue the batch")
        for name in output_names:
            host, _, _ = results[name]
            device.copy_to_host(host, self._device_buffers[name], stream)
        device.synchronize(stream)
        # Copies: the pinned buffers are reused by the next batch.
        return {
            name: results[name][0].view(results[name][2]).reshape(results[name][1]).copy()
            for name in output_names
        }

    def close(self) -> None:
        with self._device.activate():
            for buffer in self._device_buffers.values():
                self._device.free(buffer)
            self._device_buffers.clear()
            self._pinned.clear()
            self._device.destroy_stream(self._stream)
            del self._context, self._loaded


class TensorRTBackend(BackendBase):
    """Loads TensorRT plans onto a GPU; KIND_CPU cannot run them."""

    name = "tensorrt"

    def __init__(self) -> None:
        self._devices: dict[int, CudaDevice] = {}
        self._problem: str | None = None
        # (file, size, mtime, device) -> the engine its live instances share.
        self._engines: weakref.WeakValueDictionary[tuple[str, int, int, int], LoadedEngine] = (
            weakref.WeakValueDictionary()
        )
        self._engines_lock = threading.Lock()
        self._descriptions: dict[tuple[str, int, int], EngineDescription] = {}  # a few KB each

    def _engine(self, path: Path, device_id: int, device: CudaDevice) -> LoadedEngine:
        try:
            stat = path.stat()
        except OSError as exc:
            raise ModelLoadError(f"model file '{path}' cannot be read: {exc.strerror}") from None
        key = (str(path), stat.st_size, stat.st_mtime_ns, device_id)
        with self._engines_lock:
            loaded = self._engines.get(key)
            if loaded is None:
                with device.activate():
                    loaded = LoadedEngine(path)
                self._engines[key] = loaded
            return loaded

    def _device(self, device_id: int) -> CudaDevice:
        if device_id not in self._devices:
            self._devices[device_id] = open_device(device_id)
        return self._devices[device_id]

    def gpu_problem(self) -> str:
        """Why no engine can run here ('' when a GPU is usable)."""
        if self._problem is None:
            try:
                self._device(0)
                self._problem = ""
            except DeviceUnavailable as exc:
                self._problem = f"no usable GPU ({exc})"
        return self._problem

    def _describe(self, model_path: Path) -> EngineDescription:
        """The engine's description, deserialized once per file content (inspect and
        auto_complete both ask, and deserializing takes seconds on a Jetson)."""
        problem = self.gpu_problem()
        if problem:
            raise ModelLoadError(f"TensorRT engines need an NVIDIA GPU: {problem}")
        try:
            stat = model_path.stat()
        except OSError as exc:
            raise ModelLoadError(
                f"model file '{model_path}' cannot be read: {exc.strerror}"
            ) from None
        key = (str(model_path), stat.st_size, stat.st_mtime_ns)
        known = self._descriptions.get(key)
        if known is None:
            device = self._device(0)
            loaded = self._engine(model_path, 0, device)
            with device.activate():
                known = describe_engine(loaded.engine, device.name)
            self._descriptions[key] = known
        return known

    def inspect(self, model_path: Path) -> ModelSignature:
        return signature(self._describe(model_path))

    def auto_complete(
        self, model_path: Path, config: dict[str, Any], default_max_batch_size: int
    ) -> dict[str, Any]:
        # An engine's optimization profile fixes its batch size, whatever the server's default.
        return auto_complete(self._describe(model_path), config)

    def create_instance(self, spec: InstanceSpec) -> TrtInstance:
        if spec.kind == "KIND_CPU":
            raise ModelLoadError(
                "TensorRT engines run on a GPU only; use KIND_GPU instances (or serve a "
                "model.onnx from the same version folder with onnxruntime on CPU)"
            )
        try:
            device = self._device(spec.device_id)
        except DeviceUnavailable as exc:
            raise ModelLoadError(f"GPU {spec.device_id} is not usable: {exc}") from exc
        try:
            if spec.profiles:
                loaded = self._engine(spec.model_path, spec.device_id, device)
            else:
                with device.activate():
                    loaded = LoadedEngine(spec.model_path)
            return TrtInstance(spec, device, loaded)
        except DeviceError as exc:
            raise ModelLoadError(f"GPU {spec.device_id}: {exc}") from exc
