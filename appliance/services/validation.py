"""Request validation: a request checked against its model version once, for every protocol.

Error text is built only on failure; the checks on the way are plain comparisons."""

from __future__ import annotations

import asyncio
from typing import Any

from appliance.common.errors import InvalidInput
from appliance.common.limits import RequestLimits
from appliance.common.types import Array, InferRequest
from appliance.runtime.registry import ServedVersion
from appliance.scheduling.instances import Job


def _dims_match(expected: tuple[int, ...], got: tuple[int, ...]) -> bool:
    if len(expected) != len(got):
        return False
    return all(e == -1 or e == g for e, g in zip(expected, got, strict=True))


def _fmt(dims: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _names(names: list[str]) -> str:
    """A list of names as Triton writes it: ['A','B'] (no space after the comma)."""
    return "[" + ",".join(f"'{n}'" for n in names) + "]"


def request_tag(request: InferRequest) -> str:
    """tritonserver's prefix on the errors of a request's checks: `[request id: <id>] `."""
    return f"[request id: {request.id or '<id_unknown>'}] "


_BATCH_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension "
    "to be prepended to each input shape. If you want to specify the full shape including the "
    "batch dim in your input dims config, try setting max_batch_size to zero. See the model "
    "configuration docs for more info on max_batch_size."
)


def validate(
    served: ServedVersion,
    request: InferRequest,
    limits: RequestLimits,
    loop: asyncio.AbstractEventLoop | None = None,
) -> Job:
    """Check every input against the config once; error text is built only on failure. The
    job's future belongs to `loop` (default: the running loop; a front end's thread passes the
    server's)."""
    name = served.name
    max_elements = limits.max_tensor_elements or -1
    max_bytes = limits.max_request_tensor_bytes or -1
    rules = served.inputs
    batching = served.max_batch_size > 0
    arrays: dict[str, Array] = {}
    keys: list[Any] = []
    nbytes = 0
    batch = 1
    for tensor in request.inputs:
        rule = rules.get(tensor.name)
        if rule is None:
            raise InvalidInput(f"unexpected inference input '{tensor.name}' for model '{name}'")
        if tensor.name in arrays:
            raise InvalidInput(f"input '{tensor.name}' for model '{name}' is given twice")
        if tensor.datatype != rule.datatype:
            raise InvalidInput(
                f"{request_tag(request)}inference input '{tensor.name}' data-type is "
                f"'{tensor.datatype}', but model '{name}' expects '{rule.datatype}'"
            )
        shape = tensor.shape
        item_shape = shape
        if batching:
            if not shape:
                raise InvalidInput(
                    f"model '{name}' input '{tensor.name}': expected shape "
                    f"{_fmt((-1, *rule.dims))} with a batch dimension, got []"
                )
            if not arrays:
                batch = shape[0]
            elif shape[0] != batch:
                raise InvalidInput(
                    f"model '{name}': inputs have different batch sizes ({batch} and "
                    f"{shape[0]} for '{tensor.name}')"
                )
            item_shape = shape[1:]
        if item_shape != rule.dims and not _dims_match(rule.dims, item_shape):
            expected = (-1, *rule.dims) if batching else rule.dims
            raise InvalidInput(
                f"{request_tag(request)}unexpected shape for input '{tensor.name}' for model "
                f"'{name}'. Expected {_fmt(expected)}, got {_fmt(shape)}. "
                + (_BATCH_NOTE if batching else "")
            )
        data = tensor.data
        if rule.model_dims is not None:
            data = data.reshape(((shape[0],) if batching else ()) + rule.model_dims)
        arrays[tensor.name] = data
        nbytes += data.nbytes
        if data.size > max_elements >= 0:
            limits.check_elements(data.size, shape, f"model '{name}' input '{tensor.name}'")
        if nbytes > max_bytes >= 0:
            limits.check_bytes(nbytes, name, tensor.name)
        keys.append((tensor.name, None if rule.ragged and batching else item_shape))
    if len(arrays) < len(rules):
        missing = [n for n, r in rules.items() if n not in arrays and not r.optional]
        if missing:
            required = sum(1 for r in rules.values() if not r.optional)
            count = (
                f"{len(rules)} inputs"
                if required == len(rules)
                else f"number of inputs between {required} and {len(rules)}"
            )
            raise InvalidInput(
                f"{request_tag(request)}expected {count} but got {len(arrays)} inputs for "
                f"model '{name}'. Got "
                f"input(s) {_names(sorted(arrays))}, but missing required input(s) "
                f"{_names(missing)}. Please provide all required input(s)."
            )
    if batching and not arrays:  # the batch size is the first input's: there is none
        raise InvalidInput(f"{request_tag(request)}out of bounds index 0: request has 0 inputs")
    if batching and not 0 < batch <= served.max_batch_size:
        raise InvalidInput(
            f"{request_tag(request)}inference request batch-size must be <= "
            f"{served.max_batch_size} for '{name}'"
            if batch > 0
            else f"inference request batch-size must be >= 1 for '{name}', got {batch}"
        )
    priority, timeout_us = _scheduling_parameters(request, name)
    job = Job(
        inputs=arrays,
        priority=priority,
        timeout_us=timeout_us,
        batch_size=batch if batching else 1,
        # The inputs' names and non-batch shapes, in a fixed order: requests batch only with
        # requests that give the same inputs (an optional one left out is another batch).
        shape_key=tuple(keys) if len(keys) < 2 else tuple(sorted(keys)),
        output_names=(
            served.all_outputs if request.outputs is None else _output_names(served, request)
        ),
        future=(loop or asyncio.get_running_loop()).create_future(),
        nbytes=nbytes,
    )
    # The model sees them (a Python model's request), an ensemble's steps carry them.
    job.request_id, job.parameters = request.id, request.parameters
    if served.sequence:
        _sequence_parameters(request, name, job)
    return job


def _output_names(served: ServedVersion, request: InferRequest) -> tuple[str, ...]:
    assert request.outputs is not None
    names = []
    for out in request.outputs:
        if out.name not in served.outputs:
            raise InvalidInput(
                f"unexpected inference output '{out.name}' for model '{served.name}'"
            )
        if out.name in names:
            raise InvalidInput(f"output '{out.name}' already exists in request")
        if out.class_count < 0:
            raise InvalidInput(
                f"output '{out.name}': classification count must be >= 0, got {out.class_count}"
            )
        names.append(out.name)
    return tuple(names)


def _scheduling_parameters(request: InferRequest, model: str) -> tuple[int, int]:
    """The `priority` and `timeout` (microseconds) request parameters, 0 when absent."""
    if not request.parameters:  # most requests carry none
        return 0, 0
    values = []
    for key in ("priority", "timeout"):
        value = request.parameters.get(key, 0)
        if type(value) is not int or value < 0:
            raise InvalidInput(
                f"model '{model}': request parameter '{key}' must be a non-negative integer, "
                f"got {value!r}"
            )
        values.append(value)
    return values[0], values[1]


def _sequence_parameters(request: InferRequest, model: str, job: Job) -> None:
    """sequence_id (integer or string), sequence_start, sequence_end: Triton's parameters."""
    params = request.parameters
    sequence_id = params.get("sequence_id", 0)
    if type(sequence_id) not in (int, str) or sequence_id in (0, ""):
        raise InvalidInput(
            f"inference request to model '{model}' must specify a non-zero or non-empty "
            "correlation ID"
        )
    job.sequence_id = sequence_id
    job.sequence_start = bool(params.get("sequence_start", False))
    job.sequence_end = bool(params.get("sequence_end", False))
