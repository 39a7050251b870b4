"""The `triton_python_backend_utils` module that Triton's Python models import as `pb_utils`.

Example model.py, as written for Triton::

    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.config = json.loads(args["model_config"])

        def execute(self, requests):
            responses = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                out = pb_utils.Tensor("OUTPUT0", x * 2)
                responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
            return responses

        def finalize(self):
            pass
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

import numpy as np

from edge_backends.datatypes import BY_CONFIG, BY_TRITON

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2


class TritonError(Exception):
    """An error a model returns in an InferenceResponse (or raises)."""

    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS = range(7)
    CANCELLED = 7

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


class TritonModelException(Exception):
    """Raised by BLS calls that fail."""

    def message(self) -> str:
        return str(self)


class Tensor:
    """A named tensor backed by a numpy array."""

    def __init__(self, name: str, array: Any) -> None:
        if not isinstance(array, np.ndarray):
            array = np.asarray(array)
        if array.dtype.kind in ("U", "S"):
            array = array.astype(np.object_)
        self._name = name
        self._array: np.ndarray = array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        """A DLPack capsule (numpy arrays export one; from_dlpack takes it or an array)."""
        return self._array.__dlpack__()

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        return Tensor(name, np.asarray(np.from_dlpack(capsule)))


class InferenceRequest:
    """A request handed to execute(); also built by models for BLS calls (exec / async_exec)."""

    def __init__(
        self,
        model_name: str = "",
        requested_output_names: list[str] | None = None,
        inputs: list[Tensor] | None = None,
        request_id: str = "",
        correlation_id: int | str = 0,
        flags: int = 0,
        model_version: int = -1,
        parameters: dict[str, Any] | str | None = None,
        **_: Any,
    ) -> None:
        self._model_name = model_name
        self._requested = list(requested_output_names or [])
        self._inputs = list(inputs or [])
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._flags = flags
        self._model_version = model_version
        if isinstance(parameters, str):
            parameters = json.loads(parameters)
        self._parameters = parameters or {}
        self._cancel_flag: Any = None  # set by the worker: a byte shared with the server
        self._sender: Any = None  # set by the worker for decoupled models

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

    def parameters(self) -> str:
        return json.dumps(self._parameters)

    def is_cancelled(self) -> bool:
        """True once every client waiting for this request has gone away."""
        return bool(self._cancel_flag is not None and self._cancel_flag.value)

    def get_response_sender(self) -> Any:
        """Decoupled models: send zero or more responses, the last with the FINAL flag."""
        if self._sender is None:
            raise TritonModelException(
                "get_response_sender() needs model_transaction_policy { decoupled: true }"
            )
        return self._sender

    def exec(self) -> InferenceResponse:
        """Business logic scripting: run another model of the server and wait for it."""
        from edge_backends.python import worker  # the worker process that hosts this model

        return worker.bls_call(self)

    async def async_exec(self) -> InferenceResponse:
        import asyncio

        return await asyncio.get_running_loop().run_in_executor(None, self.exec)


class InferenceResponse:
    def __init__(
        self, output_tensors: list[Tensor] | None = None, error: TritonError | None = None
    ) -> None:
        self._outputs = list(output_tensors or [])
        self._error = error

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    return next((t for t in request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in response.output_tensors() if t.name() == name), None)


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((i for i in model_config.get("input", []) if i.get("name") == name), None)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((o for o in model_config.get("output", []) if o.get("name") == name), None)


def triton_string_to_numpy(triton_type: str) -> Any:
    """The numpy type of "TYPE_FP32" (config spelling) or "FP32" (wire spelling)."""
    dtype = BY_CONFIG.get(triton_type) or BY_TRITON[triton_type]
    return dtype.numpy.type


class Logger:
    """pb_utils.Logger: lines go to the worker's stderr, which the server's journal keeps."""

    _log = logging.getLogger("python_model")

    @classmethod
    def log_info(cls, message: str) -> None:
        cls._log.info("%s", message)

    @classmethod
    def log_warn(cls, message: str) -> None:
        cls._log.warning("%s", message)

    @classmethod
    def log_error(cls, message: str) -> None:
        cls._log.error("%s", message)

    @classmethod
    def log_verbose(cls, message: str) -> None:
        cls._log.debug("%s", message)

    @classmethod
    def log(cls, message: str, level: int = logging.INFO) -> None:
        cls._log.log(level, "%s", message)


def _install() -> None:
    """Make `import triton_python_backend_utils` find this module."""
    sys.modules.setdefault("triton_python_backend_utils", sys.modules[__name__])
