"""The `triton_python_backend_utils` module that Triton's Python models import as `pb_utils`.

The names, signatures and behaviour are those of Triton's python_backend (its README's API
sections), so that a `model.py` written for Triton runs unchanged. Example::

    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.config = json.loads(args["model_config"])
            self.calls = pb_utils.MetricFamily(
                name="my_calls", description="execute() calls", kind=pb_utils.MetricFamily.COUNTER
            ).Metric(labels={"model": args["model_name"]})

        def execute(self, requests):
            responses = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                out = pb_utils.Tensor("OUTPUT0", x * 2)
                responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
            self.calls.increment(1)
            return responses

        def finalize(self):
            pass

What differs from Triton is listed in docs/compatibility.md ("Python models"). Calls that
reach the server (BLS, metrics, model loading) work only inside a model's process.
"""

from __future__ import annotations

import enum
import json
import struct
import sys
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from edge_backends.datatypes import BY_CONFIG, BY_TRITON
from edge_backends.python.channel import CallFailed, Channel, Stream, connect
from edge_backends.python.model_config import (
    ModelConfig,
    get_input_config_by_name,
    get_output_config_by_name,
    using_decoupled_model_transaction_policy,
)
from edge_backends.python.pb_errors import TritonError, TritonModelException, call, server
from edge_backends.python.pb_logging import Logger, LogLevel
from edge_backends.python.pb_metrics import Metric, MetricFamily, MetricKind
from edge_backends.python.shm import pack, unpack

if TYPE_CHECKING:
    import asyncio  # imported where used: 6 MiB a model process of a synchronous model skips

__all__ = [
    "TRITONSERVER_MEMORY_CPU",
    "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITON_STRING_TO_NUMPY",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "InferenceTrace",
    "LogLevel",
    "Logger",
    "MemoryType",
    "Metric",
    "MetricFamily",
    "MetricKind",
    "ModelConfig",
    "PreferredMemory",
    "ResponseIterator",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "deserialize_bytes_tensor",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_model_dir",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "is_model_ready",
    "load_model",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "unload_model",
    "using_decoupled_model_transaction_policy",
]

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2

# Triton's TRITONSERVER_DataType numbers, as Tensor.triton_dtype() and the helpers give them.
_TRITON_DTYPES: tuple[tuple[int, Any], ...] = (
    (1, np.bool_),
    (2, np.uint8),
    (3, np.uint16),
    (4, np.uint32),
    (5, np.uint64),
    (6, np.int8),
    (7, np.int16),
    (8, np.int32),
    (9, np.int64),
    (10, np.float16),
    (11, np.float32),
    (12, np.float64),
    (13, np.object_),
)
TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

_model_dir = ""  # the model's version folder, set in a model's process by the worker


class MemoryType(enum.IntEnum):
    TRITONSERVER_MEMORY_GPU = 0
    TRITONSERVER_MEMORY_CPU = 1


TRITONSERVER_MEMORY_GPU = MemoryType.TRITONSERVER_MEMORY_GPU
TRITONSERVER_MEMORY_CPU = MemoryType.TRITONSERVER_MEMORY_CPU


class PreferredMemory:
    """Where a BLS call's outputs should be; here they are always in CPU memory."""

    def __init__(self, preferred_memory_type: MemoryType, preferred_device_id: int = 0) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


class InferenceTrace:
    """A request's trace; this server has no trace context to hand to models."""

    def get_context(self) -> str | None:
        return None


class Tensor:
    """A named tensor over a numpy array (CPU memory)."""

    __slots__ = ("_array", "_name")

    def __init__(self, name: str, array: Any) -> None:
        if not isinstance(array, np.ndarray):
            array = np.asarray(array)
        if array.dtype.kind in ("U", "S"):
            array = array.astype(np.object_)
        self._name = name
        self._array: np.ndarray[Any, Any] = array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray[Any, Any]:
        return self._array

    def triton_dtype(self) -> int:
        return numpy_to_triton_type(self._array.dtype) or 0

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        """A DLPack capsule of the tensor (zero copy)."""
        return self._array.__dlpack__()

    def __dlpack__(self, stream: Any = None) -> Any:
        return self._array.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._array.__dlpack_device__()

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        """A Tensor from a DLPack capsule or any object with `__dlpack__` (CPU, C order)."""
        if hasattr(capsule, "__dlpack__"):
            array = np.from_dlpack(capsule)
        else:  # a bare capsule: numpy takes objects, so wrap it
            array = np.from_dlpack(_Capsule(capsule))
        if not array.flags.c_contiguous:
            raise TritonModelException("from_dlpack: the tensor is not contiguous in C order")
        return Tensor(name, array)


def _input(name: str, array: np.ndarray[Any, Any]) -> Tensor:
    """A request's input tensor, as the worker builds it: the array is already numpy's."""
    tensor = Tensor.__new__(Tensor)
    tensor._name = name
    tensor._array = array
    return tensor


class _Capsule:
    """Presents a bare DLPack capsule as numpy's from_dlpack expects (a CPU array)."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, stream: Any = None, **_: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU


def _parameters_json(parameters: Any) -> str:
    if parameters is None:
        return "{}"
    if isinstance(parameters, str):
        parameters = json.loads(parameters)
    if not isinstance(parameters, dict):
        raise TritonModelException("parameters must be a dict of str to bool, int or str")
    for key, value in parameters.items():
        if not isinstance(key, str) or not isinstance(value, bool | int | str):
            raise TritonModelException(
                f"parameter '{key}': keys must be str and values bool, int or str"
            )
    return json.dumps(parameters)


class InferenceResponse:
    """A model's answer to one request: output tensors, or an error."""

    def __init__(
        self,
        output_tensors: list[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        self._outputs = list(output_tensors) if output_tensors else []
        self._error = error
        self._parameters = "{}" if parameters is None else _parameters_json(parameters)

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return self._parameters


class InferenceResponseSender:
    """Sends a request's responses (decoupled models: any number; others: exactly one); the
    last carries TRITONSERVER_RESPONSE_COMPLETE_FINAL. Given by request.get_response_sender()."""

    def __init__(self, deliver: Any, cancelled: Any) -> None:
        self._deliver = deliver  # (response | None, final: bool) -> None, set by the worker
        self._cancelled = cancelled
        self._closed = False

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if self._closed:
            raise TritonModelException("Unable to send response. Response sender has been closed.")
        final = bool(flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        if response is None and not final:
            raise TritonModelException(
                "Inference Response object is needed when the flag is not set to "
                "TRITONSERVER_RESPONSE_COMPLETE_FINAL"
            )
        if final:
            self._closed = True
        self._deliver(response, final)

    def is_cancelled(self) -> bool:
        return bool(self._cancelled())


class InferenceRequest:
    """A request handed to execute(); built by models for BLS calls (exec / async_exec)."""

    def __init__(
        self,
        request_id: str = "",
        correlation_id: int | str = 0,
        inputs: list[Tensor] | None = None,
        requested_output_names: list[str] | None = None,
        model_name: str | bytes = "",
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: PreferredMemory | None = None,
        trace: InferenceTrace | None = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        if isinstance(model_name, bytes):  # e.g. a BYTES input's element
            model_name = model_name.decode("utf-8")
        if not isinstance(correlation_id, int | str):
            raise TritonModelException("Correlation ID must be integer or string")
        self._model_name = str(model_name)
        self._requested = list(requested_output_names or [])
        self._inputs = list(inputs or [])
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._flags = int(flags)
        self._timeout = int(timeout)
        self._model_version = int(model_version)
        self._parameters = "{}" if parameters is None else _parameters_json(parameters)
        self._trace = trace  # None: an empty one, made when asked for
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        # Set by the worker on the requests it hands to execute() (`_received`):
        self._cancel_flag: Any = None  # a byte shared with the server
        self._sender: InferenceResponseSender | None = None
        self._answers: Any = None  # the worker's deliver(index, response, final), if any
        self._index = 0

    @classmethod
    def _received(
        cls,
        fields: tuple[Any, ...],
        inputs: list[Tensor],
        outputs: list[str],
        cancel_flag: Any,
        answers: Any,
        index: int,
    ) -> InferenceRequest:
        """A request the server sent, for execute(): `fields` are its RequestInfo's, as the
        link carries them; its response sender is made when asked for."""
        request_id, correlation_id, flags, parameters, timeout, output_names = fields[:6]
        request = cls.__new__(cls)
        request._model_name = ""
        request._requested = list(output_names) if output_names else list(outputs)
        request._inputs = inputs
        request._request_id = request_id
        request._correlation_id = correlation_id
        request._flags = flags
        request._timeout = timeout
        request._model_version = -1
        # A client's parameters as they came (doubles too), as python_backend's JSON text.
        request._parameters = json.dumps(dict(parameters), default=str) if parameters else "{}"
        request._trace = None
        request._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        request._cancel_flag = cancel_flag
        request._sender = None
        request._answers = answers
        request._index = index
        return request

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def requested_output_names(self) -> list[str]:
        return self._requested

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        self._flags = int(flags)

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        """The request's parameters as a JSON object text."""
        return self._parameters

    def trace(self) -> InferenceTrace:
        if self._trace is None:
            self._trace = InferenceTrace()
        return self._trace

    def is_cancelled(self) -> bool:
        """True once every client waiting for this request has gone away."""
        return bool(self._cancel_flag is not None and self._cancel_flag.value)

    def set_release_flags(self, flags: int) -> None:
        if flags & TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
            raise TritonModelException(
                "Request rescheduling needs sequence_batching { iterative_sequence: true }, "
                "which this server does not offer"
            )
        self._release_flags = int(flags)

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None:
            answers = self._answers
            if answers is None:
                raise TritonModelException(
                    "get_response_sender() is only available on requests handed to execute()"
                )
            index = self._index

            def deliver(response: InferenceResponse | None, final: bool) -> None:
                answers.deliver(index, response, final)

            self._sender = InferenceResponseSender(deliver, self.is_cancelled)
        return self._sender

    # ---- business logic scripting ---------------------------------------------------------

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on another model of the server and wait: an InferenceResponse
        (with an error when it failed), or with `decoupled=True` a ResponseIterator."""
        channel = server()
        call = self._call()
        if decoupled:
            return ResponseIterator(channel.stream("infer_stream", *call))
        try:
            outputs = unpack(channel.call("infer", *call))
        except CallFailed as exc:
            return InferenceResponse(error=TritonError(str(exc)))
        return InferenceResponse(output_tensors=[Tensor(n, a) for n, a in outputs.items()])

    def async_exec(self, decoupled: bool = False) -> asyncio.Future[Any]:
        """exec() without blocking the model's event loop; await the result. Any number may
        be in flight at once."""
        import asyncio

        return asyncio.get_running_loop().run_in_executor(None, self.exec, decoupled)

    def _call(self) -> tuple[Any, ...]:
        parameters: dict[str, Any] = json.loads(self._parameters)
        if self._correlation_id not in (0, ""):
            parameters["sequence_id"] = self._correlation_id
        if self._flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
            parameters["sequence_start"] = True
        if self._flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
            parameters["sequence_end"] = True
        if self._timeout:
            parameters["timeout"] = self._timeout
        version = "" if self._model_version < 0 else str(self._model_version)
        inputs = pack({t.name(): np.asarray(t.as_numpy()) for t in self._inputs})
        return (
            self._model_name,
            version,
            inputs,
            self._requested,
            self._request_id,
            parameters,
        )


class ResponseIterator:
    """The responses of a BLS call to a decoupled model, in order, ending with a response that
    has no outputs (the final flag); iterate it with `for` or `async for`."""

    def __init__(self, stream: Stream) -> None:
        self._stream = stream
        self._responses = self._generate()

    def _generate(self) -> Iterator[InferenceResponse]:
        try:
            for outputs in self._stream:
                yield InferenceResponse(output_tensors=[Tensor(n, a) for n, a in outputs.items()])
        except CallFailed as exc:
            yield InferenceResponse(error=TritonError(str(exc)))
            return
        yield InferenceResponse()

    def __iter__(self) -> ResponseIterator:
        return self

    def __next__(self) -> InferenceResponse:
        return next(self._responses)

    def __aiter__(self) -> AsyncIterator[InferenceResponse]:
        return self._agenerate()

    async def _agenerate(self) -> AsyncIterator[InferenceResponse]:
        import asyncio

        loop = asyncio.get_running_loop()
        while True:
            response = await loop.run_in_executor(None, next, self._responses, None)
            if response is None:
                return
            yield response

    def cancel(self) -> None:
        """Ask the called model to stop; it decides whether it does."""
        self._stream.cancel()


# ---- model loading API ----------------------------------------------------------------------


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load or reload a model (explicit model control mode); raises TritonModelException."""
    call("load_model", model_name, config, dict(files or {}))


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Unload a model (explicit model control mode); raises TritonModelException."""
    call("unload_model", model_name, bool(unload_dependents))


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    return bool(call("is_model_ready", model_name, str(model_version)))


def get_model_dir() -> str:
    """The model's version folder (where model.py is)."""
    return _model_dir


# ---- tensors and configuration --------------------------------------------------------------


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    for tensor in request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    for tensor in response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def triton_string_to_numpy(triton_type: str) -> Any:
    """The numpy type of "TYPE_FP32" (config spelling); "FP32" (wire spelling) works too."""
    if triton_type in TRITON_STRING_TO_NUMPY:
        return TRITON_STRING_TO_NUMPY[triton_type]
    dtype = BY_CONFIG.get(triton_type) or BY_TRITON[triton_type]
    return dtype.numpy.type


def triton_to_numpy_type(data_type: int) -> Any:
    """The numpy type of a TRITONSERVER_DataType number (1 BOOL ... 13 BYTES); None if other."""
    return next((t for number, t in _TRITON_DTYPES if number == data_type), None)


def numpy_to_triton_type(data_type: Any) -> int | None:
    """The TRITONSERVER_DataType number of a numpy type; None if it has none."""
    if data_type == np.bytes_:
        return 13
    return next((number for number, t in _TRITON_DTYPES if data_type == t), None)


def serialize_byte_tensor(input_tensor: np.ndarray[Any, Any]) -> Any:
    """A BYTES tensor as Triton lays it out: each element's 4-byte little-endian length, then
    its bytes, in C order; () for an empty tensor, None for a tensor that is not BYTES."""
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype != np.object_ and input_tensor.dtype.type != np.bytes_:
        return None
    parts = []
    for item in input_tensor.reshape(-1, order="C"):
        data = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts.append(struct.pack("<I", len(data)))
        parts.append(data)
    return b"".join(parts)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray[Any, Any]:
    """The elements of a serialized BYTES tensor, as a 1-D object array of bytes."""
    items = []
    offset = 0
    view = memoryview(encoded_tensor)
    while offset < len(view):
        (length,) = struct.unpack_from("<I", view, offset)
        offset += 4
        items.append(bytes(view[offset : offset + length]))
        offset += length
    return np.array(items, dtype=np.object_)


def _install(channel: Channel | None = None, model_dir: str = "") -> None:
    """Make `import triton_python_backend_utils` find this module; connect it to the server."""
    global _model_dir
    connect(channel)
    _model_dir = model_dir
    sys.modules.setdefault("triton_python_backend_utils", sys.modules[__name__])
