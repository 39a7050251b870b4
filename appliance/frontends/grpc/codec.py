"""ModelInferRequest / ModelInferResponse <-> core types.

Inputs come either as `raw_input_contents` (one bytes entry per input, as tritonclient sends
them) or as typed `contents`; outputs always go back as `raw_output_contents`, as Triton does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from appliance.common.errors import InvalidInput
from appliance.common.limits import RequestLimits
from appliance.common.protocol import service_pb2 as pb
from appliance.common.tensors import datatype, element_count, from_raw, to_raw
from appliance.common.types import (
    InferRequest,
    InferResponse,
    RequestedOutput,
    ShmTarget,
    Tensor,
)
from appliance.services.shared_memory import (
    SharedMemoryRegistry,
    read_input,
    shm_target,
    write_output,
)

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
# datatype -> numpy dtype, for the datatypes whose wire bytes are the array's own
_NUMPY = {name: datatype(name, name).numpy for name in (*CONTENTS_FIELD, "FP16") if name != "BYTES"}


def parameter_value(param: Any) -> Any:
    which = param.WhichOneof("parameter_choice")
    return getattr(param, which) if which else None


# The one `triton_` key a client may send (tritonclient's streams do); the frontend reads it.
EMPTY_FINAL_RESPONSE = "triton_enable_empty_final_response"


# The parameters tritonserver reads itself, with the kinds of value it takes (its words when
# another kind is given: "invalid value type for 'sequence_start' parameter, expected ...").
_RESERVED_KINDS = {
    "sequence_id": ("int64_param", "string_param"),
    "sequence_start": ("bool_param",),
    "sequence_end": ("bool_param",),
    "priority": ("int64_param", "uint64_param"),
    "timeout": ("int64_param",),
}


def _request_parameters(parameters: Any) -> dict[str, Any]:
    """The request's parameters for the model; tritonserver's refusals of `triton_` keys and
    of a reserved parameter given another kind of value."""
    values = {}
    for key, param in parameters.items():
        kinds = _RESERVED_KINDS.get(key)
        if kinds is not None and param.WhichOneof("parameter_choice") not in kinds:
            raise InvalidInput(
                f"invalid value type for '{key}' parameter, expected {' or '.join(kinds)}."
            )
        if key.startswith("triton_"):
            if key != EMPTY_FINAL_RESPONSE:
                raise InvalidInput(
                    "parameter keys starting with 'triton_' are reserved for Triton usage. "
                    f"Only the following keys starting with 'triton_' are allowed: "
                    f"{EMPTY_FINAL_RESPONSE}"
                )
            if param.WhichOneof("parameter_choice") != "bool_param":
                raise InvalidInput(
                    f"invalid value type for '{key}' parameter, expected bool_param."
                )
            continue  # a frontend setting, not the model's (as tritonserver)
        values[key] = parameter_value(param)
    return values


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


def names_regions(msg: pb.ModelInferRequest) -> bool:
    """Whether a ModelInferRequest's tensors have parameters (where shared memory regions are
    named): those without hold no region."""
    for tensor in msg.inputs[:]:  # a slice: a list at once, faster than iterating the field
        if tensor.parameters:
            return True
    for out in msg.outputs[:]:  # noqa: SIM110  # a loop: any() over a generator costs more
        if out.parameters:
            return True
    return False


def decode_request(
    msg: pb.ModelInferRequest,
    shm: SharedMemoryRegistry | None = None,
    limits: RequestLimits | None = None,
) -> InferRequest:
    """`limits` are checked on each input's declared shape before its data is decoded.

    Per request this is the gRPC side's hottest Python: each field read on a protobuf message
    costs a lookup and often a new object, so each is read once, repeated fields are read as
    slices (`field[:]`, a list at once: iterating the field reads it element by element), and
    parameters (shared memory, classification) are looked into only when a tensor has some."""
    model = msg.model_name
    raw = msg.raw_input_contents
    tensors = msg.inputs[:]
    # Inputs in shared memory have no raw_input_contents entry (as tritonclient sends them).
    targets: list[ShmTarget | None] | None = None
    if shm is not None:
        for tensor in tensors:
            if tensor.parameters:
                targets = [_target(tensor, shm, model, "input") for tensor in tensors]
                break
    if raw:
        for tensor in tensors:
            if tensor.HasField("contents"):
                raise InvalidInput(
                    "contents field must not be specified when using raw_input_contents for "
                    f"'{tensor.name}' for model '{model}'"
                )
        in_band = len(tensors) if targets is None else targets.count(None)
        if len(raw) < in_band:  # tritonserver's words, naming the first input left without
            unfed = [t.name for i, t in enumerate(tensors) if targets is None or targets[i] is None]
            raise InvalidInput(
                f"unable to find data for input tensor '{unfed[len(raw)]}' for model "
                f"'{model}' in request."
            )
        if len(raw) != in_band:
            raise InvalidInput(
                f"model '{model}': {in_band} inputs not in shared memory but {len(raw)} "
                "raw_input_contents; raw contents must be given for every such input or none"
            )
        raw = raw[:]  # the entries as bytes, each read once
    inputs = []
    raw_index = 0
    for index, tensor in enumerate(tensors):
        name = tensor.name
        datatype_name = tensor.datatype
        where = f"model '{model}' input '{name}'"
        shape = tuple(tensor.shape[:])
        target = None if targets is None else targets[index]
        if target is not None:
            assert shm is not None
            data = read_input(
                shm, target, datatype_name, shape, where, limits, (msg.id, model, name)
            )
        elif raw:
            data = from_raw(
                raw[raw_index], datatype_name, shape, where, limits, (msg.id, model, name)
            )
            raw_index += 1
        else:
            data = _from_contents(tensor, shape, where, limits)
        inputs.append(Tensor(name, datatype_name, shape, data))
    parameters = msg.parameters
    request = InferRequest(
        model_name=model,
        model_version=msg.model_version,
        id=msg.id,
        inputs=inputs,
        parameters=_request_parameters(parameters) if parameters else {},
    )
    requested = msg.outputs[:]
    if requested:
        outputs = []
        for out in requested:
            out_params = out.parameters
            if not out_params:
                outputs.append(RequestedOutput(out.name))
                continue
            count = (
                out_params["classification"].int64_param if "classification" in out_params else 0
            )
            target = _target(out, shm, model, "output")
            outputs.append(RequestedOutput(out.name, int(count), target))
        request.outputs = outputs
    return request


def _target(
    tensor: Any, shm: SharedMemoryRegistry | None, model: str, kind: str
) -> ShmTarget | None:
    """The shared memory window a tensor's parameters name (`kind`: input or output)."""
    if shm is None or "shared_memory_region" not in tensor.parameters:
        return None
    params = {k: parameter_value(v) for k, v in tensor.parameters.items()}
    return shm_target(params, f"model '{model}' {kind} '{tensor.name}'")


def encode_response(
    response: InferResponse,
    targets: dict[str, ShmTarget] | None = None,
    shm: SharedMemoryRegistry | None = None,
    into: pb.ModelInferResponse | None = None,
) -> pb.ModelInferResponse:
    """`response` as a ModelInferResponse: a new one, or `into` (an empty one filled in place,
    as a ModelStreamInferResponse's infer_response: wrapping a finished message copies it)."""
    if into is None:
        msg = pb.ModelInferResponse(
            model_name=response.model_name, model_version=response.model_version, id=response.id
        )
    else:
        msg = into
        msg.model_name = response.model_name
        msg.model_version = response.model_version
        msg.id = response.id
    outputs = msg.outputs
    contents = msg.raw_output_contents
    for tensor in response.outputs:
        name = tensor.name
        datatype_name = tensor.datatype
        data = tensor.data
        out = outputs.add()
        out.name = name
        out.datatype = datatype_name
        out.shape.extend(tensor.shape)
        target = targets.get(name) if targets else None
        if target is not None and shm is not None:
            # Written to the region: name, datatype and shape only, as tritonserver answers.
            if data.size:
                where = f"model '{response.model_name}' output '{name}'"
                write_output(shm, target, data, datatype_name, where)
            contents.append(b"")  # keeps raw contents aligned with outputs
            continue
        if data.dtype is _NUMPY.get(datatype_name):  # the wire's dtype: its bytes (C order)
            contents.append(data.tobytes())
        else:
            contents.append(bytes(to_raw(data, datatype_name)) if data.size else b"")
    for key, value in response.parameters.items():
        param = msg.parameters[key]
        if type(value) is bool:
            param.bool_param = value
        elif type(value) is int:
            param.int64_param = value
        elif type(value) is float:
            param.double_param = value
        else:
            param.string_param = str(value)
    return msg
