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
from appliance.frontends.tensors import from_list, from_raw, to_list, to_raw
from appliance.types import InferRequest, InferResponse, InputTensor, RequestedOutput

HEADER_LENGTH = "Inference-Header-Content-Length"


@dataclass
class HttpInferRequest:
    """The core request plus the wire choices the response must honour."""

    request: InferRequest
    binary_default: bool = False
    binary_outputs: dict[str, bool] = field(default_factory=dict)


def _shape(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) for d in value
    ):
        raise InvalidInput(f"{where}: 'shape' must be a list of integers, got {value!r}")
    return tuple(value)


def _object(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput(f"{where} must be a JSON object")
    return value


def decode_request(
    body: bytes, header_length: str | None, model: str, version: str
) -> HttpInferRequest:
    if header_length is not None:
        try:
            json_len = int(header_length)
        except ValueError:
            raise InvalidInput(
                f"{HEADER_LENGTH} must be an integer, got '{header_length}'"
            ) from None
        if json_len < 0 or json_len > len(body):
            raise InvalidInput(
                f"{HEADER_LENGTH} is {json_len} but the body has only {len(body)} bytes"
            )
    else:
        json_len = len(body)
    doc = _object(jsonconv.loads(body[:json_len], "the inference request"), "request body")
    binary = memoryview(body)[json_len:]
    where_model = f"model '{model}'"
    inputs_json = doc.get("inputs")
    if not isinstance(inputs_json, list):
        raise InvalidInput(f"inference request for {where_model} has no 'inputs' list")
    offset = 0
    inputs = []
    for i, item in enumerate(inputs_json):
        item = _object(item, f"inputs[{i}]")
        name = item.get("name")
        if not isinstance(name, str):
            raise InvalidInput(f"{where_model}: inputs[{i}] has no 'name'")
        where = f"{where_model} input '{name}'"
        dtype_name = item.get("datatype")
        if not isinstance(dtype_name, str):
            raise InvalidInput(f"{where}: 'datatype' is missing")
        shape = _shape(item.get("shape"), where)
        params = _object(item.get("parameters"), f"{where} parameters")
        size = params.get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or size < 0:
                raise InvalidInput(f"{where}: binary_data_size must be a non-negative integer")
            if offset + size > len(binary):
                raise InvalidInput(
                    f"{where}: binary_data_size {size} exceeds the {len(binary) - offset} bytes "
                    "of binary data left in the request body"
                )
            data = from_raw(binary[offset : offset + size], dtype_name, shape, where)
            offset += size
        elif "data" in item:
            data = from_list(item["data"], dtype_name, shape, where)
        else:
            raise InvalidInput(f"{where}: no 'data' and no binary_data_size parameter")
        inputs.append(InputTensor(name, dtype_name, shape, data))
    if offset != len(binary):
        raise InvalidInput(
            f"inference request for {where_model} has {len(binary) - offset} bytes of binary "
            "data that no input claims"
        )
    params = _object(doc.get("parameters"), "request parameters")
    wire = HttpInferRequest(
        request=InferRequest(
            model_name=model,
            model_version=version,
            id=str(doc.get("id", "")),
            inputs=inputs,
            parameters=params,
        ),
        binary_default=bool(params.get("binary_data_output", False)),
    )
    outputs_json = doc.get("outputs")
    if outputs_json is not None:
        if not isinstance(outputs_json, list):
            raise InvalidInput("'outputs' must be a list")
        requested = []
        for i, item in enumerate(outputs_json):
            item = _object(item, f"outputs[{i}]")
            name = item.get("name")
            if not isinstance(name, str):
                raise InvalidInput(f"{where_model}: outputs[{i}] has no 'name'")
            oparams = _object(item.get("parameters"), f"output '{name}' parameters")
            count = oparams.get("classification", 0)
            if not isinstance(count, int):
                raise InvalidInput(f"output '{name}': classification must be an integer")
            if "binary_data" in oparams:
                wire.binary_outputs[name] = bool(oparams["binary_data"])
            requested.append(RequestedOutput(name, count))
        wire.request.outputs = requested
    return wire


def encode_response(
    response: InferResponse, wire: HttpInferRequest
) -> tuple[list[bytes | memoryview], int | None]:
    """Body chunks and, when binary data follows the JSON, the JSON header's length."""
    outputs = []
    blobs: list[bytes | memoryview] = []
    float_lists = []
    for tensor in response.outputs:
        entry: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": list(tensor.shape),
        }
        if wire.binary_outputs.get(tensor.name, wire.binary_default):
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
