"""KServe v2 HTTP infer bodies <-> core types, with Triton's binary tensor data extension.

A request body is a JSON header, optionally followed by binary tensor data; the
`Inference-Header-Content-Length` header gives the JSON's length. Inputs with a
`binary_data_size` parameter take their bytes from the binary part, in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from appliance.errors import InvalidInput
from appliance.frontends import jsonconv
from appliance.limits import RequestLimits
from appliance.services.shared_memory import (
    SharedMemoryRegistry,
    read_input,
    shm_target,
    shm_targets,
    write_output,
)
from appliance.tensors import from_list, from_raw, to_list, to_raw
from appliance.types import InferRequest, InferResponse, InputTensor, RequestedOutput

HEADER_LENGTH = "Inference-Header-Content-Length"


@dataclass
class HttpInferRequest:
    """The core request plus the wire choices the response must honour."""

    request: InferRequest
    binary_default: bool = False
    binary_outputs: dict[str, bool] = field(default_factory=dict)


def _bad_shape(value: Any, where: str) -> InvalidInput:
    return InvalidInput(f"{where}: 'shape' must be a list of integers, got {value!r}")


def _object(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if type(value) is not dict:
        raise InvalidInput(f"{where} must be a JSON object")
    return value


def _header_length(header_length: str | None, body_length: int) -> int:
    if header_length is None:
        return body_length
    try:
        json_len = int(header_length)
    except ValueError:
        raise InvalidInput(f"{HEADER_LENGTH} must be an integer, got '{header_length}'") from None
    if json_len < 0 or json_len > body_length:
        raise InvalidInput(
            f"{HEADER_LENGTH} is {json_len} but the body has only {body_length} bytes"
        )
    return json_len


def decode_request(
    body: bytes | bytearray,
    header_length: str | None,
    model: str,
    version: str,
    shm: SharedMemoryRegistry | None = None,
    limits: RequestLimits | None = None,
) -> HttpInferRequest:
    """Parse an infer body. The hot path: error messages are only formatted when raised.

    `limits` are checked on each input's declared shape before its data is decoded.
    """
    json_len = _header_length(header_length, len(body))
    doc = jsonconv.loads(
        body[:json_len] if json_len != len(body) else body, "the inference request"
    )
    if type(doc) is not dict:
        raise InvalidInput("request body must be a JSON object")
    binary = memoryview(body)[json_len:]
    binary_len = len(binary)
    inputs_json = doc.get("inputs")
    if type(inputs_json) is not list:
        raise InvalidInput(f"inference request for model '{model}' has no 'inputs' list")
    offset = 0
    inputs = []
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
            params = _object(params, f"{where} parameters")
            size = params.get("binary_data_size")
            if shm is not None and "shared_memory_region" in params:
                target = shm_target(params, where)
        if target is not None:
            assert shm is not None
            data = read_input(shm, target, dtype_name, shape, where, limits)
        elif size is not None:
            if type(size) is not int or size < 0:
                raise InvalidInput(f"{where}: binary_data_size must be a non-negative integer")
            if offset + size > binary_len:
                raise InvalidInput(
                    f"{where}: binary_data_size {size} exceeds the {binary_len - offset} bytes "
                    "of binary data left in the request body"
                )
            data = from_raw(binary[offset : offset + size], dtype_name, shape, where, limits)
            offset += size
        elif "data" in item:
            data = from_list(item["data"], dtype_name, shape, where, limits)
        else:
            raise InvalidInput(f"{where}: no 'data' and no binary_data_size parameter")
        inputs.append(InputTensor(name, dtype_name, shape, data))
    if offset != binary_len:
        raise InvalidInput(
            f"inference request for model '{model}' has {binary_len - offset} bytes of binary "
            "data that no input claims"
        )
    params = _object(doc.get("parameters"), "request parameters")
    request_id = doc.get("id", "")
    wire = HttpInferRequest(
        request=InferRequest(
            model_name=model,
            model_version=version,
            id=request_id if type(request_id) is str else str(request_id),
            inputs=inputs,
            parameters=params,
        ),
        binary_default=bool(params.get("binary_data_output", False)),
    )
    outputs_json = doc.get("outputs")
    if outputs_json is not None:
        wire.request.outputs = _requested_outputs(
            outputs_json, model, wire.binary_outputs, shm is not None
        )
    return wire


def _requested_outputs(
    outputs_json: Any, model: str, binary_outputs: dict[str, bool], shm: bool
) -> list[RequestedOutput]:
    if type(outputs_json) is not list:
        raise InvalidInput("'outputs' must be a list")
    requested = []
    for i, item in enumerate(outputs_json):
        item = _object(item, f"outputs[{i}]")
        name = item.get("name")
        if type(name) is not str:
            raise InvalidInput(f"model '{model}': outputs[{i}] has no 'name'")
        oparams = _object(item.get("parameters"), f"output '{name}' parameters")
        count = oparams.get("classification", 0)
        if type(count) is not int:
            raise InvalidInput(f"output '{name}': classification must be an integer")
        if "binary_data" in oparams:
            binary_outputs[name] = bool(oparams["binary_data"])
        target = shm_target(oparams, f"model '{model}' output '{name}'") if shm else None
        requested.append(RequestedOutput(name, count, target))
    return requested


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
            where = f"model '{response.model_name}' output '{tensor.name}'"
            written = write_output(shm, target, tensor.data, tensor.datatype, where)
            entry["parameters"] = {
                "shared_memory_region": target.region,
                "shared_memory_offset": target.offset,
                "shared_memory_byte_size": written,
            }
        elif wire.binary_outputs.get(tensor.name, wire.binary_default):
            raw = to_raw(tensor.data, tensor.datatype)
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
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
