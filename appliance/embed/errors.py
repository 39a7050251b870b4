"""Triton's in-process exception classes, and the one mapping from this server's errors."""

from __future__ import annotations

from appliance.common.errors import ApplianceError, ErrorCode
from appliance.server.listeners import StartupError


class TritonError(Exception):
    """Base of every error the embedding API raises (Triton's `tritonserver.TritonError`)."""


class NotFoundError(TritonError):
    pass


class UnknownError(TritonError):
    pass


class InternalError(TritonError):
    pass


class InvalidArgumentError(TritonError):
    pass


class UnavailableError(TritonError):
    pass


class AlreadyExistsError(TritonError):
    pass


class UnsupportedError(TritonError):
    pass


class CancelledError(TritonError):
    pass


_BY_CODE: dict[ErrorCode, type[TritonError]] = {
    ErrorCode.INVALID_ARG: InvalidArgumentError,
    ErrorCode.NOT_FOUND: NotFoundError,
    ErrorCode.UNAVAILABLE: UnavailableError,
    ErrorCode.UNSUPPORTED: UnsupportedError,
    ErrorCode.CANCELLED: CancelledError,
    ErrorCode.INTERNAL: InternalError,
    ErrorCode.ALREADY_EXISTS: AlreadyExistsError,
    ErrorCode.RESOURCE_EXHAUSTED: UnavailableError,
    ErrorCode.PERMISSION_DENIED: UnavailableError,
}


def triton_error(exc: BaseException) -> TritonError:
    """The Triton exception for one of this server's errors (its message kept)."""
    if isinstance(exc, TritonError):
        return exc
    if isinstance(exc, ApplianceError):
        return _BY_CODE.get(exc.code, UnknownError)(exc.message)
    if isinstance(exc, StartupError):  # its message says what: a port in use, a bad model
        return InternalError(str(exc))
    return InternalError(f"{type(exc).__name__}: {exc}")
