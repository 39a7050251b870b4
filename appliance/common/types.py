"""The core's own words for requests and responses, independent of any wire protocol."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

Array = np.ndarray[Any, Any]


@dataclass(slots=True)
class Tensor:
    """A request's input or a response's output: the array has the declared dtype and shape
    (an input as decoded from the wire, an output as the model made it)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: Array


@dataclass(frozen=True, slots=True)
class ShmTarget:
    """A window of a registered system shared memory region (services/shared_memory.py)."""

    region: str
    offset: int
    byte_size: int


@dataclass(slots=True)
class RequestedOutput:
    name: str
    class_count: int = 0  # > 0: the classification extension's top-k strings
    shm: ShmTarget | None = None  # written into shared memory instead of the response


@dataclass(slots=True)
class InferRequest:
    model_name: str
    model_version: str = ""  # "" = the policy's latest ready version
    id: str = ""
    inputs: list[Tensor] = field(default_factory=list)
    outputs: list[RequestedOutput] | None = None  # None = every output
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class InferResponse:
    model_name: str
    model_version: str
    id: str
    outputs: list[Tensor]
    parameters: dict[str, Any] = field(default_factory=dict)

    def arrays(self) -> dict[str, Any]:
        """Its outputs' data by name (a request made inside the server: BLS, ensemble steps)."""
        return {tensor.name: tensor.data for tensor in self.outputs}
