"""Per-request input limits: how many elements one input and how many tensor bytes one request
may hold. Checked from the declared shapes before a decoder allocates, and again in the core
on the decoded arrays, for both protocols. Defaults protect a 4 GB device."""

from __future__ import annotations

from dataclasses import dataclass

from appliance.common.errors import RequestTooLarge

# A 4K RGB frame (3840x2160x3 = 24.9M) fits; a BYTES tensor of this many elements still costs
# a few hundred MB of Python objects, which a 4 GB device survives.
DEFAULT_MAX_TENSOR_ELEMENTS = 1 << 25
# Twice the default body limit: JSON integers widen to 8 bytes when decoded.
DEFAULT_MAX_REQUEST_TENSOR_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class RequestLimits:
    """0 means no limit."""

    max_tensor_elements: int = DEFAULT_MAX_TENSOR_ELEMENTS
    max_request_tensor_bytes: int = DEFAULT_MAX_REQUEST_TENSOR_BYTES

    def check_elements(self, count: int, shape: tuple[int, ...], where: str) -> None:
        """`where` names the model and the input."""
        limit = self.max_tensor_elements
        if limit and count > limit:
            raise RequestTooLarge(
                f"{where}: shape {list(shape)} has {count} elements, more than the limit of "
                f"{limit} per input (raise it with --max-tensor-elements)"
            )

    def check_bytes(self, total: int, model: str, name: str) -> None:
        """`total`: the request's tensor bytes up to and including input `name`."""
        limit = self.max_request_tensor_bytes
        if limit and total > limit:
            raise RequestTooLarge(
                f"model '{model}' input '{name}': the request's tensors reach {total} bytes, "
                f"more than the limit of {limit} per request "
                "(raise it with --max-request-tensor-bytes)"
            )


NO_LIMITS = RequestLimits(0, 0)
