"""The error types of `triton_python_backend_utils`: TritonError and TritonModelException."""

from __future__ import annotations

from typing import Any

from edge_backends.python.channel import CallFailed, Channel, current


class TritonError:
    """An error a model puts in an InferenceResponse; `code` is one of the class constants."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        if message is None or code is None:
            raise TypeError("TritonError(message, code): neither may be None")
        self._message = str(message)
        self._code = int(code)

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, {self._code})"


class TritonModelException(Exception):
    """Raised by a model (initialize, execute, finalize) to fail, and by the API's calls that
    fail (a metric misused, a model that cannot be loaded, ...)."""

    def message(self) -> str:
        return str(self)


def server() -> Channel:
    """The model process's channel to the server; TritonModelException outside one."""
    channel = current()
    if channel is None:
        raise TritonModelException("this call works only inside a model served by the server")
    return channel


def call(operation: str, *arguments: Any) -> Any:
    """One call to the server; its failure as the TritonModelException a model sees."""
    try:
        return server().call(operation, *arguments)
    except CallFailed as exc:
        raise TritonModelException(str(exc)) from None
