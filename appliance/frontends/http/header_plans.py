"""Decoded binary-tensor request headers, kept for the next request with the same header.

A client sending binary tensors (tritonclient, perf_analyzer, a camera's loop) sends the same
JSON header with every request to a model: the same inputs, shapes, byte sizes and requested
outputs; only the bytes after it change. Parsing and checking that header is most of what
decoding such a request costs (`simple`: about 8 of 12 us in-process). So once a header has
decoded without error, what it says is kept as a `HeaderPlan`, keyed by its exact bytes with
the model and version of the URL, and a request with the same header is decoded from the plan:
only its tensors are cut out of the body (numpy views, as before).

Only headers whose every input is binary (`binary_data_size`, not BYTES, no shared memory)
and whose outputs name no shared memory are kept: everything else a header can say is
decoded afresh each time. Each request gets its own request objects; a plan holds only
immutable values. The cache holds at most `MAX_PLANS` headers of at most `MAX_HEADER_BYTES`
each, and starts afresh when full, so a client sending ever new headers costs a bounded
amount of memory and the usual decoding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from appliance.common.limits import RequestLimits
from appliance.common.types import InferRequest, RequestedOutput, Tensor

MAX_PLANS = 256
MAX_HEADER_BYTES = 4096

PlanKey = tuple[str, str, bytes]  # model, version, the header's bytes


@dataclass(frozen=True, slots=True)
class InputPlan:
    name: str
    datatype: str
    shape: tuple[int, ...]
    numpy: np.dtype[Any]
    count: int  # elements
    size: int  # bytes of the binary part it takes


@dataclass(frozen=True, slots=True)
class HeaderPlan:
    """What a header that decoded without error said."""

    limits: RequestLimits | None  # the limits it was checked against
    inputs: tuple[InputPlan, ...]
    binary_bytes: int  # the binary part's length (the inputs' sizes added)
    request_id: str
    parameters: tuple[tuple[str, Any], ...]  # the request's parameters (JSON scalars)
    binary_default: bool
    binary_outputs: tuple[tuple[str, bool], ...]
    outputs: tuple[tuple[str, int], ...] | None  # (name, classification count); None: all

    def request(
        self, binary: memoryview, model: str, version: str
    ) -> tuple[InferRequest, dict[str, bool]]:
        """A new request from this header and the binary part that followed it (whose length
        the caller checked is `binary_bytes`); the outputs asked for binary."""
        inputs = []
        offset = 0
        for item in self.inputs:
            end = offset + item.size
            data = np.frombuffer(binary[offset:end], item.numpy, item.count)
            shape = item.shape
            inputs.append(Tensor(item.name, item.datatype, shape, data.reshape(shape)))
            offset = end
        request = InferRequest(
            model_name=model,
            model_version=version,
            id=self.request_id,
            inputs=inputs,
            parameters=dict(self.parameters),
        )
        if self.outputs is not None:
            request.outputs = [RequestedOutput(name, count) for name, count in self.outputs]
        return request, dict(self.binary_outputs)


class HeaderPlans:
    """The plans of the headers seen last, by model, version and header bytes."""

    def __init__(self) -> None:
        self._plans: dict[PlanKey, HeaderPlan] = {}

    def __len__(self) -> int:
        return len(self._plans)

    def get(self, key: PlanKey, limits: RequestLimits | None) -> HeaderPlan | None:
        plan = self._plans.get(key)
        return plan if plan is not None and plan.limits is limits else None

    def keep(self, key: PlanKey, plan: HeaderPlan) -> None:
        if len(self._plans) >= MAX_PLANS:
            self._plans.clear()  # a client sending ever new headers: start afresh
        self._plans[key] = plan


def scalar_parameters(params: dict[str, Any]) -> tuple[tuple[str, Any], ...] | None:
    """A request's parameters as a plan keeps them, or None when one is not a JSON scalar
    (a list or object a model could change would be shared between requests)."""
    for value in params.values():
        if type(value) not in (str, int, float, bool) and value is not None:
            return None
    return tuple(params.items())
