"""Triton's in-process `tritonserver` names, served by this server (issue 38).

    from appliance import tritonserver   # instead of: import tritonserver

docs/compatibility.md ("The embedding API") lists what is provided and what differs.
"""

from __future__ import annotations

from appliance import __version__
from appliance.embed.errors import (
    AlreadyExistsError,
    CancelledError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    TritonError,
    UnavailableError,
    UnknownError,
    UnsupportedError,
)
from appliance.embed.model import (
    AsyncResponseIterator,
    InferenceRequest,
    InferenceResponse,
    Model,
    ResponseIterator,
)
from appliance.embed.options import LogCallback, LogFormat, LogLevel, ModelControlMode, Options
from appliance.embed.server import ModelDictionary, Server
from appliance.embed.tensor import DataType, MemoryType, Tensor

__all__ = [
    "AlreadyExistsError",
    "AsyncResponseIterator",
    "CancelledError",
    "DataType",
    "InferenceRequest",
    "InferenceResponse",
    "InternalError",
    "InvalidArgumentError",
    "LogCallback",
    "LogFormat",
    "LogLevel",
    "MemoryType",
    "Model",
    "ModelControlMode",
    "ModelDictionary",
    "NotFoundError",
    "Options",
    "ResponseIterator",
    "Server",
    "Tensor",
    "TritonError",
    "UnavailableError",
    "UnknownError",
    "UnsupportedError",
    "__version__",
]
