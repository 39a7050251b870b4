"""One mapping from what a backend hands back for a request to what the client is told.

Every scheduler (dynamic, direct, sequence, ensemble) settles its jobs through `settle`, so a
backend's error means the same thing whichever scheduler ran it:

- A backend error whose `code` names the client's fault or a state (`InputRejected`: the
  request's contents cannot be given to the model; a Python model's `TritonError` with
  INVALID_ARG, NOT_FOUND, UNAVAILABLE, UNSUPPORTED): that error, e.g. 400 / INVALID_ARGUMENT.
- An `ApplianceError` (raised on purpose by the server): as it is.
- Any other `BackendError` (the model failed): `InferenceFailed` with the backend's message.
- Anything else is a bug (in the server or a backend): logged once, with its traceback and the
  model and version, and answered as an internal error that says so; one log line per failed
  execution, not one per request of the batch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from appliance.common.errors import (
    ApplianceError,
    InferenceFailed,
    InvalidInput,
    ModelNotFound,
    ServerUnavailable,
    Unsupported,
)
from appliance.common.types import Array
from edge_backends.api import BackendError, ResponseError

log = logging.getLogger(__name__)

Outcome = dict[str, Array] | BaseException

# A backend error's code (Triton's names) -> the error the client gets; others are INTERNAL.
_BY_CODE: dict[str, type[ApplianceError]] = {
    "INVALID_ARG": InvalidInput,
    "NOT_FOUND": ModelNotFound,
    "UNAVAILABLE": ServerUnavailable,
    "UNSUPPORTED": Unsupported,
}


def client_error(label: str, outcome: BaseException) -> ApplianceError:
    """The error a client sees for a backend's exception (`label`: "model 'm' version 1")."""
    if isinstance(outcome, ApplianceError):
        return outcome
    if isinstance(outcome, ResponseError):  # the model's own words, as tritonserver sends them
        error = _BY_CODE.get(outcome.code, InferenceFailed)(str(outcome))
        error.model_response = True  # a success in the statistics, as in tritonserver
        return error
    if isinstance(outcome, BackendError):
        kind = _BY_CODE.get(outcome.code)
        if kind is not None:  # the backend says whose fault it is (e.g. a model's TritonError)
            return kind(f"{label}: {outcome}")
        return InferenceFailed(f"{label} failed: {outcome}")
    return InferenceFailed(
        f"{label} failed: internal error ({type(outcome).__name__}); see the server log"
    )


def log_unexpected(label: str, outcomes: Iterable[Outcome]) -> None:
    """Log each distinct unexpected exception of one execution once, with its traceback."""
    seen: set[int] = set()
    for outcome in outcomes:
        if not isinstance(outcome, BaseException) or id(outcome) in seen:
            continue
        seen.add(id(outcome))
        if not isinstance(outcome, ApplianceError | BackendError):
            log.error(
                "%s: unexpected %s while running a batch",
                label,
                type(outcome).__name__,
                exc_info=outcome,
            )


def settle(label: str, future: asyncio.Future[dict[str, Array]], outcome: Outcome) -> None:
    """Resolve one request's future with its outputs or the error the client should see."""
    if future.done():  # cancelled by the client, or failed at shutdown
        return
    if isinstance(outcome, BaseException):
        future.set_exception(client_error(label, outcome))
    else:
        future.set_result(outcome)
