"""KServe v2 HTTP infer bodies <-> core types, with Triton's binary tensor data extension.

A request body is a JSON header, optionally followed by binary tensor data; the
`Inference-Header-Content-Length` header gives the JSON's length. Inputs with a
`binary_data_size` parameter take their bytes from the binary part, in order. With the header
at 0 the body is a raw binary request: no JSON, the bytes of the model's one input, whose shape
is deduced from the config (batch 1, one variable dimension at most; BYTES: shape [1]), and
every output comes back binary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from appliance.common.errors import InvalidInput
from appliance.common.limits import RequestLimits
from appliance.common.model_config import datatype_of
from appliance.common.protocol import ModelConfig
from appliance.common.tensors import datatype, from_list, from_raw, to_list, to_raw
from appliance.common.types import InferRequest, InferResponse, RequestedOutput, Tensor
from appliance.frontends import jsonconv
from appliance.frontends.http.header_plans import (
    MAX_HEADER_BYTES,
    HeaderPlan,
    HeaderPlans,
    InputPlan,
    PlanKey,
    scalar_parameters,
)
from appliance.services.shared_memory import (
    SharedMemoryRegistry,
    read_input,
    shm_target,
    shm_targets,
    write_output,
)

HEADER_LENGTH = "Inference-Header-Content-Length"


@dataclass
class HttpInferRequest:
    """The core request plus the wire choices the response must honour."""

    request: InferRequest
    binary_default: bool = False
    binary_outputs: dict[str, bool] = field(default_factory=dict)


def _bad_shape(value: Any, where: str) -> InvalidInput:
    return InvalidInput(f"{where}: 'shape' must be a list of integers, got {value!r}")


# The parameters tritonserver reads itself and the JSON it takes for each: another value is
# refused in its words (its 500, "Unable to parse 'sequence_start': attempt to access JSON
# non-boolean as boolean"; here 400: bad input).
_RESERVED_JSON = {
    "sequence_id": "string",  # or an unsigned integer
    "sequence_start": "boolean",
    "sequence_end": "boolean",
    "binary_data_output": "boolean",
    "priority": "unsigned-integer",
    "timeout": "unsigned-integer",
}


def _is(value: Any, kind: str) -> bool:
    if kind == "boolean":
        return type(value) is bool
    unsigned = type(value) is int and value >= 0
    return unsigned or (kind == "string" and type(value) is str)


def check_parameter_types(params: dict[str, Any]) -> None:
    """tritonserver's refusals of request parameter values: a reserved one of the wrong JSON
    type, and any other that is not an integer, a boolean or a string (null, objects, lists)."""
    for key, value in params.items():
        kind = _RESERVED_JSON.get(key)
        if kind is not None:
            if not _is(value, kind):
                raise InvalidInput(
                    f"Unable to parse '{key}': attempt to access JSON non-{kind} as {kind}"
                )
        elif value is None or isinstance(value, (dict, list)):
            raise InvalidInput(
                f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or "
                "'string'."
            )


def _object(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if type(value) is not dict:
        raise InvalidInput(f"{where} must be a JSON object")
    return value


def _header_length(header_length: str | None, body_length: int) -> int:
    """The JSON header's length, with tritonserver's texts for a bad one."""
    if header_length is None:
        return body_length
    try:
        json_len = int(header_length)
    except ValueError:
        raise InvalidInput(f"Unable to parse {HEADER_LENGTH}, got: {header_length}") from None
    if json_len < 0 or json_len > body_length:
        raise InvalidInput(
            f"inference header size should be in range (0, {body_length}), got: {header_length}"
        )
    return json_len


def _raw_request(
    body: bytes | bytearray,
    model: str,
    version: str,
    config: ModelConfig,
    limits: RequestLimits | None,
) -> HttpInferRequest:
    """A raw binary request (Triton's binary data extension): the whole body is the one
    input's bytes; its name, datatype and shape come from the model's config."""
    if len(config.input) != 1:
        raise InvalidInput(
            "Raw request must only have 1 input (found 1) to be deduced but got "
            f"{len(config.input)} inputs in '{model}' model configuration"
        )
    spec = config.input[0]
    name = datatype_of(spec.data_type)
    dims = [int(d) for d in spec.dims]
    where = f"model '{model}' input '{spec.name}'"
    shape = [1] if config.max_batch_size > 0 else []
    if name == "BYTES":
        if -1 in dims or int(np.prod(dims)) != 1:
            raise InvalidInput(
                f"For BYTE datatype raw input '{spec.name}', the model must have input shape [1]"
            )
        data: Any = np.array([bytes(body)], dtype=np.object_).reshape([*shape, *dims])
    else:
        if dims.count(-1) > 1:
            raise InvalidInput(
                f"The shape of the raw input '{spec.name}' can not be deduced because there "
                "are more than one variable-sized dimension"
            )
        if -1 in dims:
            fixed = int(np.prod([d for d in dims if d != -1]))
            dims[dims.index(-1)] = len(body) // max(1, fixed * datatype(name, where).itemsize)
        data = from_raw(memoryview(body), name, (*shape, *dims), where, limits)
    tensor = Tensor(spec.name, name, (*shape, *dims), data)
    request = InferRequest(model_name=model, model_version=version, inputs=[tensor])
    return HttpInferRequest(request=request, binary_default=True)


def decode_request(
    body: bytes | bytearray,
    header_length: str | None,
    model: str,
    version: str,
    shm: SharedMemoryRegistry | None = None,
    limits: RequestLimits | None = None,
    config: Callable[[], ModelConfig] | None = None,
    plans: HeaderPlans | None = None,
) -> HttpInferRequest:
    """Parse an infer body. The hot path: error messages are only formatted when raised.

    `limits` are checked on each input's declared shape before its data is decoded. `config`
    gives the model's config for a raw binary request (header length 0). `plans`: the headers
    of binary requests decoded before (header_plans.py); a request whose header is one of them
    is decoded from its plan, and a new header that can be kept is added.
    """
    json_len = _header_length(header_length, len(body))
    if json_len == 0 and header_length is not None and config is not None:
        return _raw_request(body, model, version, config(), limits)
    plan_key: PlanKey | None = None
    if json_len == len(body):
        header: bytes | bytearray = body
    else:
        header = bytes(memoryview(body)[:json_len])
        if plans is not None and json_len <= MAX_HEADER_BYTES:
            plan_key = (model, version, header)
            plan = plans.get(plan_key, limits)
            if plan is not None and len(body) - json_len == plan.binary_bytes:
                request, binary_outputs = plan.request(memoryview(body)[json_len:], model, version)
                return HttpInferRequest(request, plan.binary_default, binary_outputs)
    doc = jsonconv.loads(header, "the inference request")
    if type(doc) is not dict:
        raise InvalidInput("request body must be a JSON object")
    binary = memoryview(body)[json_len:]
    binary_len = len(binary)
    inputs_json = doc.get("inputs")
    if type(inputs_json) is not list:
        raise InvalidInput(f"inference request for model '{model}' has no 'inputs' list")
    offset = 0
    inputs = []
    # What a plan of this header would hold; None once the header says something a plan
    # does not keep (JSON data, BYTES, shared memory).
    planned: list[InputPlan] | None = [] if plan_key is not None else None
    for i, item in enumerate(inputs_json):
        if type(item) is not dict:
            raise InvalidInput(f"inputs[{i}] must be a JSON object")
        name = item.get("name")
        if type(name) is not str:
            raise InvalidInput(f"model '{model}': inputs[{i}] has no 'name'")
        where = f"model '{model}' input '{name}'"
        dtype_name = item.get("datatype")
        if type(dtype_name) is not str:
            raise InvalidInput(f"{where}: 'datatype' is missing")
        raw_shape = item.get("shape")
        if type(raw_shape) is not list:
            raise _bad_shape(raw_shape, where)
        for d in raw_shape:
            if type(d) is not int:
                raise _bad_shape(raw_shape, where)
        shape = tuple(raw_shape)
        params = item.get("parameters")
        size = target = None
        if params is not None:
            if type(params) is not dict:
                raise InvalidInput(f"{where} parameters must be a JSON object")
            size = params.get("binary_data_size")
            if shm is not None and "shared_memory_region" in params:
                target = shm_target(params, where)
        if target is not None:
            assert shm is not None
            data = read_input(
                shm, target, dtype_name, shape, where, limits,
                (str(doc.get("id", "")), model, name),
            )
            planned = None
        elif size is not None:
            if type(size) is not int or size < 0:
                raise InvalidInput(f"{where}: binary_data_size must be a non-negative integer")
            end = offset + size
            if end > binary_len:
                raise InvalidInput(
                    f"{where}: binary_data_size {size} exceeds the {binary_len - offset} bytes "
                    "of binary data left in the request body"
                )
            data = from_raw(
                binary[offset:end], dtype_name, shape, where, limits,
                (str(doc.get("id", "")), model, name),
            )
            offset = end
            if planned is not None and data.dtype != np.object_:
                planned.append(InputPlan(name, dtype_name, shape, data.dtype, data.size, size))
            else:
                planned = None
        elif "data" in item:
            data = from_list(item["data"], dtype_name, shape, where, limits)
            planned = None
        else:
            raise InvalidInput(f"{where}: no 'data' and no binary_data_size parameter")
        inputs.append(Tensor(name, dtype_name, shape, data))
    if offset != binary_len:
        raise InvalidInput(
            f"inference request for model '{model}' has {binary_len - offset} bytes of binary "
            "data that no input claims"
        )
    request_id = doc.get("id", "")
    if type(request_id) is not str:  # tritonserver's words (its 500: here 400, bad input)
        raise InvalidInput("Unable to parse 'id': attempt to access JSON non-string as string")
    params = _object(doc.get("parameters"), "request parameters")
    if params:
        check_parameter_types(params)
        for key in params:
            if key.startswith("triton_"):
                raise InvalidInput(
                    "parameter keys starting with 'triton_' are reserved for Triton usage and "
                    "should not be specified."
                )
    wire = HttpInferRequest(
        request=InferRequest(
            model_name=model,
            model_version=version,
            id=request_id,
            inputs=inputs,
            parameters=params,
        ),
        binary_default=bool(params.get("binary_data_output", False)),
    )
    outputs_json = doc.get("outputs")
    if outputs_json is not None and outputs_json != []:  # an empty list: all, as tritonserver
        wire.request.outputs = _requested_outputs(
            outputs_json, model, wire.binary_outputs, shm is not None
        )
    if planned is not None and plan_key is not None and plans is not None:
        _keep_plan(plans, plan_key, limits, planned, offset, wire)
    return wire


def _keep_plan(
    plans: HeaderPlans,
    key: PlanKey,
    limits: RequestLimits | None,
    inputs: list[InputPlan],
    binary_bytes: int,
    wire: HttpInferRequest,
) -> None:
    """Keep what a header that decoded without error said, if a plan can hold all of it."""
    request = wire.request
    outputs = request.outputs
    if outputs is not None and any(o.shm is not None for o in outputs):
        return
    parameters = scalar_parameters(request.parameters)
    if parameters is None:
        return
    plans.keep(
        key,
        HeaderPlan(
            limits=limits,
            inputs=tuple(inputs),
            binary_bytes=binary_bytes,
            request_id=request.id,
            parameters=parameters,
            binary_default=wire.binary_default,
            binary_outputs=tuple(wire.binary_outputs.items()),
            outputs=None if outputs is None else tuple((o.name, o.class_count) for o in outputs),
        ),
    )


def _requested_outputs(
    outputs_json: Any, model: str, binary_outputs: dict[str, bool], shm: bool
) -> list[RequestedOutput]:
    if type(outputs_json) is not list:
        raise InvalidInput("'outputs' must be a list")
    requested = []
    for i, item in enumerate(outputs_json):
        if type(item) is not dict:
            item = _object(item, f"outputs[{i}]")  # None is {}; anything else is refused
        name = item.get("name")
        if type(name) is not str:
            raise InvalidInput(f"model '{model}': outputs[{i}] has no 'name'")
        oparams = item.get("parameters")
        count = 0
        target = None
        if oparams is not None:
            if type(oparams) is not dict:
                raise InvalidInput(f"output '{name}' parameters must be a JSON object")
            count = oparams.get("classification", 0)
            if type(count) is not int:
                raise InvalidInput(f"output '{name}': classification must be an integer")
            if "binary_data" in oparams:
                binary_outputs[name] = bool(oparams["binary_data"])
            if shm and "shared_memory_region" in oparams:
                target = shm_target(oparams, f"model '{model}' output '{name}'")
        requested.append(RequestedOutput(name, count, target))
    return requested


def _utf8_list(array: Any, model: str, name: str) -> list[str]:
    """A BYTES output as JSON strings; bytes that are not UTF-8 are refused, never replaced
    (tritonserver writes them into the JSON as they are, which its clients cannot parse)."""
    values = []
    for i, value in enumerate(array.ravel()):
        if isinstance(value, bytes):
            try:
                values.append(value.decode("utf-8"))
            except UnicodeDecodeError:
                raise InvalidInput(
                    f"model '{model}' output '{name}' element {i} holds BYTES that are not "
                    "valid UTF-8, which JSON cannot carry; request the output with "
                    '"binary_data": true'
                ) from None
        else:
            values.append(str(value))
    return values


def encode_response(
    response: InferResponse, wire: HttpInferRequest, shm: SharedMemoryRegistry | None = None
) -> tuple[list[bytes | memoryview], int | None]:
    """Body chunks and, when binary data follows the JSON, the JSON header's length."""
    outputs = []
    blobs: list[bytes | memoryview] = []
    float_lists = []
    targets = shm_targets(wire.request.outputs)
    for tensor in response.outputs:
        entry: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": list(tensor.shape),
        }
        target = targets.get(tensor.name)
        if target is not None and shm is not None:
            # Written to the region; tritonserver's entry says only name, datatype and shape
            # (Triton's C++ client, perf_analyzer's, reads any `parameters` as binary data).
            if tensor.data.size:
                where = f"model '{response.model_name}' output '{tensor.name}'"
                write_output(shm, target, tensor.data, tensor.datatype, where)
        elif wire.binary_outputs.get(tensor.name, wire.binary_default):
            raw = to_raw(tensor.data, tensor.datatype) if tensor.data.size else b""
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        elif tensor.datatype == "BYTES":
            entry["data"] = _utf8_list(tensor.data, response.model_name, tensor.name)
        else:
            entry["data"] = to_list(tensor.data, tensor.datatype)
            if tensor.datatype in ("FP16", "FP32", "FP64"):
                float_lists.append(entry["data"])
        outputs.append(entry)
    doc: dict[str, Any] = {
        "model_name": response.model_name,
        "model_version": response.model_version,
        "outputs": outputs,
    }
    if response.id:
        doc["id"] = response.id
    if response.parameters:
        doc["parameters"] = response.parameters
    header = jsonconv.dumps(doc, float_lists)
    if not blobs:
        return [header], None
    return [header, *blobs], len(header)
