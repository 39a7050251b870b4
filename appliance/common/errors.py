"""One error hierarchy for the core; front ends map `code` to HTTP status / gRPC code."""

from __future__ import annotations

import enum
from typing import ClassVar


class ErrorCode(enum.Enum):
    """Triton's error codes."""

    INVALID_ARG = "invalid_arg"
    NOT_FOUND = "not_found"
    UNAVAILABLE = "unavailable"
    UNSUPPORTED = "unsupported"
    CANCELLED = "cancelled"
    INTERNAL = "internal"
    ALREADY_EXISTS = "already_exists"
    RESOURCE_EXHAUSTED = "resource_exhausted"
    PERMISSION_DENIED = "permission_denied"


class ApplianceError(Exception):
    """Base of every error the core raises on purpose; the message is shown to the client."""

    code: ClassVar[ErrorCode] = ErrorCode.INTERNAL
    # How tritonserver's statistics count the request this error fails (services/inference.py):
    # a model's own error response (a Python model's InferenceResponse(error=...)) is a
    # success there; a request its scheduler refused before queueing it (tritonserver's
    # Enqueue returned the error: a sequence request without START) is not counted at all.
    model_response: bool = False
    uncounted: ClassVar[bool] = False

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else type(self).__name__


class InvalidInput(ApplianceError):
    """The request is malformed or does not match the model's inputs."""

    code = ErrorCode.INVALID_ARG


class IncompleteBytes(InvalidInput):
    """A BYTES element whose length prefix runs past the data. tritonserver's backend finds
    it as it reads the request, so its statistics count the request a BACKEND failure; here
    the decoder finds it, and the request's admission counts it so (services/inference.py)."""


class ModelNotFound(ApplianceError):
    code = ErrorCode.NOT_FOUND


class UnknownModel(ModelNotFound):
    """A model name the server does not know: NOT_FOUND (404), as tritonserver answers it
    (INVALID_ARG only with --model-namespacing, which this server does not implement)."""


class ModelNotReady(ApplianceError):
    code = ErrorCode.UNAVAILABLE


class Unsupported(ApplianceError):
    code = ErrorCode.UNSUPPORTED


class DecoupledOnUnary(Unsupported):
    """A decoupled model asked for one response (HTTP infer, gRPC ModelInfer): each front end
    puts tritonserver's words for its protocol first."""


class ServerUnavailable(ApplianceError):
    """The server is shutting down or otherwise refusing work."""

    code = ErrorCode.UNAVAILABLE


class QueueFull(ApplianceError):
    code = ErrorCode.UNAVAILABLE


class RequestTooLarge(ApplianceError):
    code = ErrorCode.RESOURCE_EXHAUSTED


class InferenceFailed(ApplianceError):
    """The backend failed while running the model."""

    code = ErrorCode.INTERNAL


class ClientShmDisabled(ApplianceError):
    """A shared memory region registered or unregistered by a client of a server started
    without --allow-client-shm=true (tritonserver's words; it answers 501 / UNIMPLEMENTED:
    here the server's configuration forbids it, 403 / PERMISSION_DENIED)."""

    code = ErrorCode.PERMISSION_DENIED

    def __init__(self) -> None:
        super().__init__(
            "Client shared memory is disabled. Start the server with "
            "'--allow-client-shm=true' to enable."
        )


class ConfigError(ApplianceError):
    """A config.pbtxt or model folder is invalid; the message names the file and field."""

    code = ErrorCode.INVALID_ARG


class NoVersionAvailable(ConfigError):
    """A model's version policy matches none of its version folders, in tritonserver's words
    (core's ModelLifeCycle::AsyncLoad); a load request answers them after its prefix."""

    def __init__(self, model: str, detail: str = "") -> None:
        self.model = model
        super().__init__(
            "at least one version must be available under the version policy of model "
            f"'{model}'{detail}"
        )
