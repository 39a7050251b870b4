"""ModelInferRequest / ModelInferResponse <-> core types.

Inputs come either as `raw_input_contents` (one bytes entry per input, as tritonclient sends
them) or as typed `contents`; outputs always go back as `raw_output_contents`, as Triton does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from appliance.errors import InvalidInput
from appliance.limits import RequestLimits
from appliance.protocol import service_pb2 as pb
from appliance.services.shared_memory import (
    SharedMemoryRegistry,
    read_input,
    shm_target,
    write_output,
)
from appliance.tensors import datatype, element_count, from_raw, to_raw
from appliance.types import InferRequest, InferResponse, InputTensor, RequestedOutput, ShmTarget

# datatype -> the InferTensorContents field that carries it (FP16 travels only as raw bytes)
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def parameter_value(param: Any) -> Any:
    which = param.WhichOneof("parameter_choice")
    return getattr(param, which) if which else None


def _from_contents(
    tensor: Any, shape: tuple[int, ...], where: str, limits: RequestLimits | None
) -> np.ndarray[Any, Any]:
    dtype = datatype(tensor.datatype, where)
    field = CONTENTS_FIELD.get(tensor.datatype)
    if field is None:
        raise InvalidInput(f"{where}: {tensor.datatype} must be sent in raw_input_contents")
    values = getattr(tensor.contents, field)
    count = element_count(shape, where, limits)
    if len(values) != count:
        raise InvalidInput(
            f"{where}: unexpected number of elements {len(values)} in contents.{field}, "
            f"expecting {count} for shape {list(shape)}"
        )
    if tensor.datatype == "BYTES":
        array = np.empty(count, dtype=np.object_)
        array[:] = list(values)
        return array.reshape(shape)
    try:
        return np.array(values, dtype=dtype.numpy).reshape(shape)
    except (OverflowError, ValueError) as exc:
        raise InvalidInput(
            f"{where}: contents.{field} holds a value out of range for {tensor.datatype}: {exc}"
        ) from exc


def decode_request(
    msg: pb.ModelInferRequest,
    shm: SharedMemoryRegistry | None = None,
    limits: RequestLimits | None = None,
) -> InferRequest:
    """`limits` are checked on each input's declared shape before its data is decoded."""
    model = msg.model_name
    raw = msg.raw_input_contents
    # Inputs in shared memory have no raw_input_contents entry (as tritonclient sends them).
    targets = [
        _target(tensor, shm, f"model '{model}' input '{tensor.name}'") for tensor in msg.inputs
    ]
    if raw:
        for tensor in msg.inputs:
            if tensor.HasField("contents"):
                raise InvalidInput(
                    "contents field must not be specified when using raw_input_contents for "
                    f"'{tensor.name}' for model '{model}'"
                )
    in_band = sum(1 for target in targets if target is None)
    if raw and len(raw) != in_band:
        raise InvalidInput(
            f"model '{model}': {in_band} inputs not in shared memory but {len(raw)} "
            "raw_input_contents; raw contents must be given for every such input or none"
        )
    inputs = []
    raw_index = 0
    for tensor, target in zip(msg.inputs, targets, strict=True):
        where = f"model '{model}' input '{tensor.name}'"
        shape = tuple(tensor.shape)
        if target is not None:
            assert shm is not None
            data = read_input(shm, target, tensor.datatype, shape, where, limits)
        elif raw:
            data = from_raw(raw[raw_index], tensor.datatype, shape, where, limits)
            raw_index += 1
        else:
            data = _from_contents(tensor, shape, where, limits)
        inputs.append(InputTensor(tensor.name, tensor.datatype, shape, data))
    request = InferRequest(
        model_name=model,
        model_version=msg.model_version,
        id=msg.id,
        inputs=inputs,
        parameters={k: parameter_value(v) for k, v in msg.parameters.items()},
    )
    if msg.outputs:
        outputs = []
        for out in msg.outputs:
            count = (
                out.parameters["classification"].int64_param
                if ("classification" in out.parameters)
                else 0
            )
            where = f"model '{model}' output '{out.name}'"
            outputs.append(RequestedOutput(out.name, int(count), _target(out, shm, where)))
        request.outputs = outputs
    return request


def _target(tensor: Any, shm: SharedMemoryRegistry | None, where: str) -> ShmTarget | None:
    if shm is None or "shared_memory_region" not in tensor.parameters:
        return None
    params = {k: parameter_value(v) for k, v in tensor.parameters.items()}
    return shm_target(params, where)


def encode_response(
    response: InferResponse,
    targets: dict[str, ShmTarget] | None = None,
    shm: SharedMemoryRegistry | None = None,
) -> pb.ModelInferResponse:
    msg = pb.ModelInferResponse(
        model_name=response.model_name, model_version=response.model_version, id=response.id
    )
    for tensor in response.outputs:
        out = msg.outputs.add()
        out.name = tensor.name
        out.datatype = tensor.datatype
        out.shape.extend(tensor.shape)
        target = targets.get(tensor.name) if targets else None
        if target is not None and shm is not None:
            # Written to the region: name, datatype and shape only, as tritonserver answers.
            if tensor.data.size:
                where = f"model '{response.model_name}' output '{tensor.name}'"
                write_output(shm, target, tensor.data, tensor.datatype, where)
            msg.raw_output_contents.append(b"")  # keeps raw contents aligned with outputs
            continue
        raw = bytes(to_raw(tensor.data, tensor.datatype)) if tensor.data.size else b""
        msg.raw_output_contents.append(raw)
    return msg
